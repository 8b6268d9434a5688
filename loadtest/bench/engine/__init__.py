"""The builtin engine's step costs: `python -m loadtest.bench.engine --out DIR [--quick]`.

Three measurements, side by side in one run, each in fresh processes (worker.py, run as
`loadtest.bench.engine.worker`) so every rank owns its torch thread count and its Gloo world
on a free 127.0.0.1 port:

1. Broadcast latency of the step message alone. Two ranks; per iteration the leader calls
   `engine.runtime.messages.send` on exactly the message `LeaderEngine._step` sends for a
   decode step of 1 or 8 sequences, the follower calls `receive` (what `run_follower` calls)
   and, once it has the decoded message, acks with a 1-value broadcast from rank 1. Leader and
   follower stamp CLOCK_MONOTONIC (shared by all processes on Linux), so "one-way" is the true
   time from the leader entering send() to the follower holding the decoded message, with no
   queueing (one message in flight). Also shown: how long send() blocks the leader, and the
   round trip. The one-way p50 is the "raw broadcast latency" the aim is measured against.

2. Per-step runtime overhead at TP=2, from stamps paired within each step. The leader is an
   instrumented LeaderEngine subclass (step start/end, forward start/end, send() start/end);
   the follower is the real follower loop (`engine.runtime.follower.run_follower`) on a model
   whose forwards are stamped, with receive() stamped too. The leader's i-th forward and the
   follower's i-th forward are the same step. The model runs from the moment both ranks are
   inside forward (the later start; whoever is first waits at the first all-reduce) to the
   leader's forward end; the rest of the step is the runtime's: schedule, the step message
   on the wire, the follower decoding it, sampling, the scheduler update and the token
   events. Only steps that decode the full batch (1 or 8 single-token entries) count. The
   p50 of that per-step runtime is compared with the one-way broadcast p50 of (1).
   Why paired: the model time at TP=2 moves by 1-2 ms between runs (Gloo all-reduce tails on
   loopback), so "step p50 minus a separately measured forward p50" could not resolve a few
   hundred microseconds (it read 0.6x and 2.6x on two runs of the same code). Also shown: the
   lockstep forward alone (both ranks, no runtime) beside the model time inside the step, and
   the runtime per step at TP=1, where there is no follower and step minus forward is exact.

3. Decode throughput through `LeaderEngine.generate` (no HTTP), 1 and 8 concurrent requests,
   greedy, ignore_eos, a fixed 16-token prompt: decode tok/s = tokens after each request's
   first / (last token - first token of any request); e2e tok/s = all tokens / (last token -
   submit). At TP=1 (leader only) with 1 and 2 torch threads, and at TP=2 (leader + follower
   subprocess). Each round runs the batch to completion; one warm-up round is discarded.

Threads: every TP=2 rank runs torch.set_num_threads(1) (2 cores, 2 ranks: more would
oversubscribe); TP=1 is measured with 1 and 2. Nothing is pinned. The machine's load average
is recorded at start and end: other work on the 2 cores inflates everything.
"""
