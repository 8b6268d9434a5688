"""What precise routing by the units' KV cache events costs one gateway process, measured in
this process (no servers, about a minute):

1. the KV index's memory per block held by one unit and by two (tracemalloc and RSS: see
   memory.py for which says what), against what `kv_index_blocks`'s docs claim;
2. the events one process reads and applies (`wire.read_frame`, `KvIndex.apply`) on frames
   encoded as vLLM 0.32 sends them (frames.py; vLLM is not needed): batches and blocks a
   second, CPU microseconds a stored and a removed block;
3. a request's CPU on the request path: its prompt ids (`Prompts.ids`, SmolLM2's tokenizer
   exported from the packaged GGUF), the cache lookup (`KvFleet.depths`) and the latency
   model (`Forecast.estimates`, and one request's learning);
4. from 2, the share of a core each worker process spends on a fleet's events when each
   subscribes on its own (`workers > 1`), and how much of it one subscriber in the control
   plane could take off it.

    python -m loadtest.bench.kv_costs --out DIR [--quick]

Writes DIR/kv_costs.json and DIR/kv_costs.md and prints the tables. Figures are CPU time
(the process's clock), so other work on the machine moves them less than wall time would.
"""
