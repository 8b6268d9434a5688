"""The unit engine: a leader and its followers running one model's shards in step.

The leader schedules, samples and serves the node contract and the OpenAI API (`server/`);
each step it broadcasts the model's inputs to its followers over the unit's torch.distributed
(Gloo) group (`runtime/`), and every node runs its shard (`model/`). A unit runs this builtin
engine or vLLM (`backends/`); docs/engine.md describes both.
"""
