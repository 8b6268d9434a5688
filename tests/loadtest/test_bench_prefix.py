"""The prefix-routing benchmark's pure parts: the workload it sends every mode, the KV cache
arithmetic that sizes it, what it reads from Prometheus text, and the tables it writes."""

from __future__ import annotations

import math

import orjson
import pytest

from loadtest.bench.prefix import pressure, report, scrape
from loadtest.bench.prefix.load import Answer, Phase
from loadtest.bench.prefix.workload import build

# SmolLM2-135M's config.json, the fields the KV arithmetic reads
SMOLLM2 = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
}


def test_the_same_seed_gives_the_same_requests_and_another_seed_others() -> None:
    a, b = build(5, 40, 3, seed=7), build(5, 40, 3, seed=7)
    assert a == b
    assert a.bodies("smol", 4) == b.bodies("smol", 4)
    assert build(5, 40, 3, seed=8).prefixes != a.prefixes


def test_every_group_comes_once_a_round_and_groups_differ_from_their_start() -> None:
    work = build(6, 300, 4, seed=1)
    groups = [r.group for r in work.requests]
    assert [sorted(groups[i : i + 6]) for i in range(0, 24, 6)] == [list(range(6))] * 4
    assert groups[:6] != list(range(6))  # shuffled
    assert len({p[:40] for p in work.prefixes}) == 6  # the approximate hash tells them apart
    assert len({r.question for r in work.requests}) == 24
    assert all(len(p.split()) >= 300 for p in work.prefixes)


def test_a_body_is_a_greedy_stream_with_its_usage_and_every_token() -> None:
    work = build(2, 20, 1, seed=1)
    body = orjson.loads(work.bodies("smol", 6)[0])
    request = work.requests[0]
    assert body["messages"] == [
        {"role": "system", "content": work.prefixes[request.group]},
        {"role": "user", "content": request.question},
    ]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"]) == (6, 0, True)


def test_sizes_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        build(0, 10, 1, seed=1)


def test_a_smollm2_token_holds_45_kib_of_kv_and_360_mib_64_blocks() -> None:
    per_token = pressure.kv_bytes_per_token(SMOLLM2)
    assert per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert pressure.kv_bytes_per_token(SMOLLM2 | {"head_dim": 32}, "bfloat16") == 11_520
    assert pressure.blocks_in(360 << 20, per_token) == 64
    assert pressure.blocks_in(1 << 30, per_token) == 182  # VLLM_CPU_KVCACHE_SPACE=1's


def test_groups_fill_the_share_of_the_fleet_asked_for() -> None:
    assert pressure.groups_for(0.75, 126, 8) == 12  # 94.5 blocks / 8
    assert pressure.groups_for(0.01, 126, 8) == 2  # never fewer than two
    with pytest.raises(ValueError):
        pressure.groups_for(0.5, 126, 0)
    sized = pressure.Pressure(0.75, 12, 96, 63, 2)
    assert sized.fleet_blocks == 126
    assert sized.share_of_fleet == pytest.approx(96 / 126)
    assert sized.share_of_server == pytest.approx(96 / 63)  # load alone cannot hold it
    assert "12 groups, 96 blocks: 76% of the fleet's 126" in sized.describe()


def test_shared_tokens_and_the_hit_ceiling() -> None:
    assert pressure.shared_tokens([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert pressure.shared_tokens([[1, 2], [1, 2, 3]]) == 2
    assert pressure.shared_tokens([]) == 0
    # groups 0, 1, 0, 1, 0: the first of each cannot hit; 3 requests find 128 tokens each
    ceiling = pressure.hit_ceiling([200] * 5, [0, 1, 0, 1, 0], [128, 128])
    assert ceiling == pytest.approx(3 * 128 / 1000)
    assert pressure.hit_ceiling([], [], []) == 0.0


VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="smol"} 4000.0
vllm:prefix_cache_queries_created{engine="0",model_name="smol"} 1.7e9
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="smol"} 2560.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="64"} 1.0
"""

GATEWAY_METRICS = """\
# TYPE unitgate_kv_events_trusted gauge
unitgate_kv_events_trusted{unit="v0"} 1.0
unitgate_kv_events_trusted{unit="v1"} 0.0
# TYPE unitgate_kv_events_batches counter
unitgate_kv_events_batches_total{unit="v0"} 30.0
unitgate_kv_events_batches_total{unit="v1"} 12.0
# TYPE unitgate_kv_events_replays counter
unitgate_kv_events_replays_total{unit="v0"} 2.0
# TYPE unitgate_kv_events_drops counter
unitgate_kv_events_drops_total{unit="v0"} 0.0
# TYPE unitgate_kv_events_bad_frames counter
unitgate_kv_events_bad_frames_total{unit="v0"} 0.0
# TYPE unitgate_kv_index_blocks gauge
unitgate_kv_index_blocks 77.0
# TYPE unitgate_kv_index_orphans counter
unitgate_kv_index_orphans_total 3.0
# TYPE unitgate_prefix_predictions counter
unitgate_prefix_predictions_total{outcome="exact",unit="v0"} 18.0
unitgate_prefix_predictions_total{outcome="exact",unit="v1"} 1.0
unitgate_prefix_predictions_total{outcome="over",unit="v1"} 1.0
"""


def test_vllms_counters_and_cache_size_are_read() -> None:
    assert scrape.cache(VLLM_METRICS) == scrape.Cache(2560.0, 4000.0)
    info = scrape.cache_info(VLLM_METRICS)
    assert (info["num_gpu_blocks"], info["block_size"]) == ("64", "128")
    assert scrape.cache_info("") == {}


def test_the_fleets_hit_rate_and_busiest_unit_come_from_the_deltas() -> None:
    before = scrape.Cache(100.0, 1000.0)
    deltas = {"a": scrape.Cache(700.0, 3000.0) - before, "b": scrape.Cache(0.0, 1000.0)}
    assert deltas["a"] == scrape.Cache(600.0, 2000.0)
    assert scrape.hit_rate(deltas) == pytest.approx(600 / 3000)
    assert scrape.busiest_share(deltas) == pytest.approx(2 / 3)
    assert math.isnan(scrape.hit_rate({"a": scrape.Cache(0.0, 0.0)}))


def test_the_gateways_kv_figures_counters_as_deltas_gauges_as_they_end() -> None:
    after = scrape.kv_figures(GATEWAY_METRICS)
    assert after == {
        "batches": 42.0,
        "replays": 2.0,
        "drops": 0.0,
        "bad_frames": 0.0,
        "orphans": 3.0,
        "index_blocks": 77.0,
        "trusted_units": 1.0,
        "predicted_exact": 19.0,
        "predicted_over": 1.0,
        "predicted_under": 0.0,
    }
    before = after | {"batches": 40.0, "index_blocks": 0.0, "orphans": 3.0}
    deltas = scrape.kv_deltas(before, after)
    assert (deltas["batches"], deltas["orphans"], deltas["index_blocks"]) == (2.0, 0.0, 77.0)


def _result(mode: str, ttfts: list[float], kv: dict[str, float] | None = None) -> report.Result:
    answers = (*(Answer(t, 6) for t in ttfts), Answer(None, 0, "HTTP 503: busy"))
    caches = {"a": scrape.Cache(300.0, 1000.0), "b": scrape.Cache(100.0, 1000.0)}
    sized = pressure.Pressure(0.75, 12, 96, 63, 2)
    return report.Result(sized, 0.7, mode, Phase(answers, 2.0), caches, kv)


def test_a_row_holds_percentiles_throughput_hit_rate_and_failures() -> None:
    row = report.row(_result("load", [0.1 * i for i in range(1, 11)]))
    assert (row["mode"], row["requests"], row["failures"], row["groups"]) == ("load", 11, 1, 12)
    assert row["ttft_p50_s"] == pytest.approx(0.5)
    assert row["ttft_p90_s"] == pytest.approx(0.9)
    assert row["ttft_p99_s"] == pytest.approx(1.0)
    assert row["output_tokens_per_s"] == pytest.approx(30.0)  # 10 answers x 6 tokens / 2 s
    assert row["hit_rate"] == pytest.approx(0.2)
    assert row["busiest_share"] == pytest.approx(0.5)
    assert row["kv"] is None
    orjson.dumps(row)  # the JSON report takes it as it is


def test_the_markdown_table_has_a_row_per_mode_and_the_kv_table_the_precise_ones() -> None:
    kv = scrape.kv_figures(GATEWAY_METRICS)
    rows = [
        report.row(_result("load", [2.0, 3.0])),
        report.row(_result("precise", [0.25, 0.5], kv)),
    ]
    text = report.markdown(rows, ["a note"])
    lines = text.splitlines()
    assert lines[0].startswith("| working set | mode | TTFT p50 s |")
    assert (
        lines[2]
        == "| 76% (12 groups) | load | 2.00 | 3.00 | 3.00 | 6.0 | 20% (of 70%) | 50% | 1/3 |"
    )
    assert lines[3].startswith("| 76% (12 groups) | precise | 0.25 | 0.50 |")
    kv_head = lines.index("| working set | mode | index blocks | event batches | replays | drops"
                          " | bad frames | orphans | trusted units"
                          " | cached tokens predicted within 5% |")  # fmt: skip
    assert (
        lines[kv_head + 2]
        == "| 76% (12 groups) | precise | 77 | 42 | 2 | 0 | 0 | 3 | 1 | 95% of 20 |"
    )
    assert len(lines) == kv_head + 3 + 2 and lines[-1] == "- a note"
