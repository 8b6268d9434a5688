"""A stock vLLM server's load and progress, read from its Prometheus `/metrics` text.

The whole exposition is about 50 KB (every histogram bucket of every latency metric) and
parsing all of it costs milliseconds; the prober needs a handful of samples. So their lines
are picked out first with a byte scan, and only they go to `prometheus_client`'s parser (a
library, so the text format's escapes, labels and special values are read right).

What is read, summed over every label set (an engine per data-parallel rank, a model name):
- `vllm:num_requests_running` and `vllm:num_requests_waiting`: the load;
- `vllm:kv_cache_usage_perc` (older releases: `vllm:gpu_cache_usage_perc`): KV-cache use, 0..1;
- steps: the `_count` of the `vllm:iteration_tokens_total` histogram, which vLLM observes
  once per engine step that produced output (a full /metrics without it: the prompt and
  generation token counters summed);
- progress: anything that moves while the engine works. Steps alone stand still through a
  long prefill (a step that only prefills a chunk produces no output, and the prompt token
  counter moves at the first token), but each chunk allocates KV blocks and the scheduler
  reports the new `kv_cache_usage_perc` every step, and a newly scheduled request adds to
  `vllm:prefix_cache_queries_total`. So progress changes whenever any of the three does.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
STEPS = "vllm:iteration_tokens_total"
TOKENS = ("vllm:prompt_tokens", "vllm:generation_tokens")
QUERIES = "vllm:prefix_cache_queries_total"
# The sample names read (a histogram's count, a counter's total), each as a line starts.
_SAMPLES = (RUNNING, WAITING, *KV_USAGE, STEPS + "_count", QUERIES)
# Read only where a server has no step histogram (then the token counters stand in).
_FALLBACK = tuple(f"{name}_total" for name in TOKENS)
# prometheus_client's exposition returns only the samples named in `name[]` query parameters:
# a few hundred bytes instead of ~50 KB (2 ms instead of 24 ms for vLLM 0.32 to answer). vLLM
# serves it at /metrics/ (its exact /metrics route ignores the query); a server without that
# path is read at /metrics in full, and `wanted_lines` picks from everything.
FULL = "/metrics"
QUERY = "/metrics/?" + "&".join(f"name[]={quote(name, safe='')}" for name in _SAMPLES).replace(
    "[]", "%5B%5D"
)
_STARTS = tuple(
    b"\n" + name.encode() + end for name in (*_SAMPLES, *_FALLBACK) for end in (b"{", b" ")
)


_MASK = (1 << 62) - 1


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    waiting: int
    kv_usage: float | None  # 0..1, None when the server does not export it
    steps: int | None  # engine steps that produced output; None when nothing exports them
    progress: int | None  # changes whenever the engine works (see above); None: unknown


def wanted_lines(text: bytes) -> str:
    """The exposition's sample lines read here (untyped to the parser: names stay as sent)."""
    text = b"\n" + text  # so the first line starts like the others
    keep: list[bytes] = []
    for start in _STARTS:  # a search per name: far cheaper than testing every line
        at = text.find(start)
        while at >= 0:
            end = text.find(b"\n", at + 1)
            keep.append(text[at + 1 : end if end >= 0 else len(text)])
            at = text.find(start, at + 1)
    return b"\n".join(keep).decode("utf-8", "replace") + "\n"


def parse_load(text: bytes) -> EngineLoad | None:
    """The load in a /metrics answer; None when it has no request gauges (not vLLM's)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted_lines(text)):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    if RUNNING not in sums or WAITING not in sums:
        return None
    kv = next((sums[name] for name in KV_USAGE if name in sums), None)
    tokens = [sums[f"{name}_total"] for name in TOKENS if f"{name}_total" in sums]
    steps = sums.get(STEPS + "_count")
    if steps is None and tokens:
        steps = sum(tokens)
    moving = (steps, sums.get(QUERIES), kv)
    progress = None if all(v is None for v in moving) else hash(moving) & _MASK
    return EngineLoad(
        int(sums[RUNNING]),
        int(sums[WAITING]),
        kv,
        None if steps is None else int(steps),
        progress,
    )
