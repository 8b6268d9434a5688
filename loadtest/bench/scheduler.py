"""`python -m loadtest.bench.scheduler`: the scheduler's per-step bookkeeping vs output length.

One decode step of 8 sequences (schedule + update with one token each, a stop string set, the
byte tokenizer), timed at output lengths 64, 512 and 2,000 tokens. Side by side in one run:
the scheduler, and the same step plus, per sequence, a decode of all its output and a stop
string search of all that text: the work the scheduler did per token before incremental
detokenization, so the ratio approximates what that change buys. In process, no torch: this
is pure Python bookkeeping on the leader's critical path, between the model's forward and the
next step message.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

from engine.model import ByteTokenizer
from engine.scheduler import SamplingParams, Scheduler, SchedulerConfig, find_stop

BATCH = 8
LENGTHS = (64, 512, 2000)
TOKENIZER = ByteTokenizer()


def _full_redecode(sched: Scheduler) -> None:
    """The pre-incremental cost on top of a step: decode all output, search all of it."""
    for seq_id in range(BATCH):
        seq = sched.get(seq_id)
        if seq is not None:
            find_stop(TOKENIZER.decode(seq.output_ids), seq.params.stop)


def _run(lengths: Sequence[int], steps: int, baseline: bool) -> dict[int, float]:
    """Median microseconds per step at each output length."""
    config = SchedulerConfig(8, 4096, 8, max(lengths) + steps + 64)
    sched = Scheduler(config, TOKENIZER.stop_ids, TOKENIZER.decode)
    params = SamplingParams(max_tokens=config.max_seq_len - 32, temperature=0.0, stop=("\n\n",))
    for i in range(BATCH):
        sched.add(i, tuple(range(65, 81)), params)
    out: dict[int, float] = {}
    produced = 0
    for length in lengths:
        while produced < length:
            batch = sched.schedule()
            sched.update(dict.fromkeys(batch.seq_ids, 65 + produced % 26))
            produced += 0 if batch.is_prefill else 1
        times = []
        for k in range(steps):
            t0 = time.perf_counter_ns()
            batch = sched.schedule()
            sched.update(dict.fromkeys(batch.seq_ids, 65 + k % 26))
            if baseline:
                _full_redecode(sched)
            times.append(time.perf_counter_ns() - t0)
        produced += steps
        out[length] = statistics.median(times) / 1e3
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.scheduler", description=__doc__)
    p.add_argument("--steps", type=int, default=200, help="timed steps per length (200)")
    args = p.parse_args(argv)
    now = _run(LENGTHS, args.steps, baseline=False)
    before = _run(LENGTHS, args.steps, baseline=True)
    print(f"decode step of {BATCH} sequences, median us: scheduler / with full re-decode / ratio")
    for length in LENGTHS:
        ratio = before[length] / now[length]
        row = f"{now[length]:7.1f} / {before[length]:7.1f} / {ratio:.1f}x"
        print(f"  {length:>5} output tokens: {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
