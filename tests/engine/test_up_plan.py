"""`unitgate up` policy without processes: config units -> node specs, restart backoff, and
`unitgate node`'s flag checks (engine.settings)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.flags import build_parser
from engine.settings import NodeSettings
from gateway.config import Config, config_from_dict
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.plan import EngineOptions, NodeSpec, PlanError, is_loopback, plan_units


def config(*units: dict[str, Any], models: tuple[str, ...] = ("m",)) -> Config:
    return config_from_dict({"gateway": {"models": list(models)}, "units": list(units)})


def unit(uid: str, *ports: int, host: str = "127.0.0.1", **extra: Any) -> dict[str, Any]:
    urls = [f"http://{host}:{p}" for p in ports]
    return {"id": uid, "leader": urls[0], "nodes": urls, **extra}


def test_loopback_units_become_one_spec_per_node_in_rank_order() -> None:
    plan = plan_units(config(unit("u0", 8101, 8102), unit("u1", 8201, 8202, 8203)))
    assert [u.unit for u in plan.units] == ["u0", "u1"] and plan.skipped == ()
    u1 = plan.units[1]
    assert [(n.rank, n.world_size, n.port, n.role) for n in u1.nodes] == [
        (0, 3, 8201, "leader"),
        (1, 3, 8202, "follower"),
        (2, 3, 8203, "follower"),
    ]
    assert u1.leader.host == "127.0.0.1" and u1.leader.served_model == "m"


def test_remote_units_are_skipped_and_mixed_units_refused() -> None:
    plan = plan_units(config(unit("u0", 8101), unit("far", 9000, host="10.0.0.7")))
    assert [u.unit for u in plan.units] == ["u0"] and plan.skipped == ("far",)
    mixed = {
        "id": "x",
        "leader": "http://127.0.0.1:1",
        "nodes": ["http://127.0.0.1:1", "http://10.0.0.7:2"],
    }
    with pytest.raises(PlanError, match="some nodes are on loopback"):
        plan_units(config(mixed))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"id": "x", "leader": "http://127.0.0.1:1", "nodes": ["http://127.0.0.2:2"]},
            "nodes\\[0\\] .* another port on its host",
        ),
        ({"id": "x", "leader": "http://127.0.0.1"}, "http://HOST:PORT"),
        ({"id": "x", "leader": "https://127.0.0.1:5"}, "http://HOST:PORT"),
    ],
)
def test_unrunnable_units_are_refused_by_name(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=f"unit x: .*{message}"):
        plan_units(config(raw))


def test_a_port_used_twice_is_refused() -> None:
    with pytest.raises(PlanError, match="port 8102: used by u0 rank 1 and u1 rank 0"):
        plan_units(config(unit("u0", 8101, 8102), unit("u1", 8102, 8103)))


def test_a_leader_health_port_is_checked_with_every_other_port() -> None:
    u0 = {"id": "u0", "leader": "http://127.0.0.1:8101", "nodes": ["http://127.0.0.1:8100"]}
    with pytest.raises(PlanError, match="port 8100: used by u0 rank 0 and u1 rank 1"):
        plan_units(config(u0, unit("u1", 8201, 8100)))
    own = {**u0, "nodes": ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]}
    with pytest.raises(PlanError, match="port 8101: used by u0 rank 0 and u0 rank 1"):
        plan_units(config(own))


def test_nodes0_on_another_port_is_the_leaders_health_listener() -> None:
    split = {
        "id": "u0",
        "leader": "http://127.0.0.1:8101",
        "nodes": ["http://127.0.0.1:8100", "http://127.0.0.1:8102"],
    }
    leader, follower = plan_units(config(split, unit("u1", 8201, 8202))).units[0].nodes
    assert (leader.port, leader.health_port, leader.ports) == (8101, 8100, (8101, 8100))
    assert leader.health_url == "http://127.0.0.1:8100/health"
    assert (follower.port, follower.health_port) == (8102, None)
    ns = build_parser().parse_args(leader.argv("127.0.0.1:5000", EngineOptions()))
    assert (ns.host, ns.port, ns.health_host, ns.health_port) == (
        "127.0.0.1",
        8101,
        "127.0.0.1",
        8100,
    )
    NodeSettings.from_flags(ns)


def test_nodes0_equal_to_the_leader_keeps_health_on_the_api_port() -> None:
    leader = plan_units(config(unit("u0", 8101, 8102))).units[0].leader
    assert (leader.health_port, leader.health_url) == (None, "http://127.0.0.1:8101/health")
    argv = leader.argv("127.0.0.1:5000", EngineOptions())
    assert "--health-port" not in argv and "--health-host" not in argv
    assert NodeSettings.from_flags(build_parser().parse_args(argv)).health_port is None


def test_a_followers_health_port_defaults_to_a_free_one() -> None:
    flags = ["--role", "follower", "--rank", "1", "--world-size", "2"]
    ns = NodeSettings.from_flags(build_parser().parse_args(flags))
    assert (ns.health_host, ns.health_port) == ("127.0.0.1", 0)
    ns = NodeSettings.from_flags(build_parser().parse_args(["--role", "leader", "--host", "::1"]))
    assert (ns.health_host, ns.health_port) == ("::1", None)


def test_served_model_is_the_units_first_model_else_the_gateways() -> None:
    plan = plan_units(config(unit("a", 1001), unit("b", 1002, models=["y"]), models=("x", "y")))
    assert [u.leader.served_model for u in plan.units] == ["x", "y"]


def test_argv_leader_serves_the_api_followers_serve_health() -> None:
    opts = EngineOptions(seed=3, threads=2)
    leader = NodeSpec("u0", 0, 2, "127.0.0.1", 8101, "m").argv("127.0.0.1:5000", opts)
    follower = NodeSpec("u0", 1, 2, "127.0.0.1", 8102, "m").argv("127.0.0.1:5000", opts)
    assert leader[:2] == ["--role", "leader"]
    ns = build_parser().parse_args(leader)
    assert (ns.host, ns.port, ns.served_model_name, ns.seed, ns.threads) == (
        "127.0.0.1",
        8101,
        "m",
        3,
        2,
    )
    ns = build_parser().parse_args(follower)
    assert (ns.role, ns.rank, ns.health_port, ns.master, ns.world_size) == (
        "follower",
        1,
        8102,
        "127.0.0.1:5000",
        2,
    )
    NodeSettings.from_flags(ns)


def test_a_units_model_and_context_reach_every_node() -> None:
    smollm2 = unit("u0", 8101, 8102, model="smollm2", max_seq_len=2048, weight_dtype="float16")
    plan = plan_units(config(smollm2))
    for node in plan.units[0].nodes:
        ns = build_parser().parse_args(node.argv("127.0.0.1:5000", EngineOptions()))
        assert (ns.model, ns.max_seq_len, ns.weight_dtype) == ("smollm2", 2048, "float16")
        assert NodeSettings.from_flags(ns).max_seq_len == 2048
    plain = plan_units(config(unit("u0", 8101)))
    ns = build_parser().parse_args(plain.units[0].leader.argv("127.0.0.1:5000", EngineOptions()))
    assert (ns.model, ns.max_seq_len, ns.weight_dtype) == ("tiny", None, None)


def test_a_units_prefill_chunk_reaches_every_node() -> None:
    plan = plan_units(config(unit("u0", 8101, 8102, prefill_chunk=96)))
    for node in plan.units[0].nodes:
        argv = node.argv("127.0.0.1:5000", EngineOptions())
        assert argv[argv.index("--prefill-chunk") + 1] == "96"
        assert NodeSettings.from_flags(build_parser().parse_args(argv)).prefill_chunk == 96
    plain = plan_units(config(unit("u0", 8101))).units[0].leader
    assert "--prefill-chunk" not in plain.argv("127.0.0.1:5000", EngineOptions())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"prefill_chunk": 0}, r"prefill_chunk must be >= 1, got 0"),
        ({"prefill_chunk": "big"}, "prefill_chunk"),
        (
            {"backend": "vllm", "model": "/m", "prefill_chunk": 512},
            r"prefill_chunk only applies to .*builtin.*engine_args.max_num_batched_tokens.*got 512",
        ),
        (
            {"kind": "vllm", "prefill_chunk": 512},
            'prefill_chunk only applies to kind = "unitgate".*got 512',
        ),
        ({"max_seq_len": 1}, "max_seq_len"),
        ({"backend": "vllm", "model": "/m", "max_seq_len": 512}, "max_model_len"),
        ({"weight_dtype": "int4"}, "weight_dtype.*must be one of"),
        ({"weight_dtype": "gguf"}, "weight_dtype needs a GGUF model .* not the seeded tiny"),
        ({"backend": "vllm", "model": "/m", "weight_dtype": "float16"}, "engine_args.dtype"),
    ],
)
def test_bad_engine_settings_are_refused_by_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(unit("u0", 8101, **extra))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "example.com", "0.0.0.0"])
def test_other_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_backoff_doubles_to_the_cap_and_resets_after_a_long_run() -> None:
    b = Backoff(base=1.0, cap=8.0, reset_after=60.0)
    assert [b.delay(uptime=1.0) for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert b.delay(uptime=60.0) == 1.0
    assert b.delay(uptime=5.0) == 2.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--role", "leader", "--rank", "1", "--world-size", "2"], "--rank: a leader has rank 0"),
        (["--role", "follower", "--rank", "0", "--world-size", "2"], "--rank: a follower has"),
        (["--role", "follower", "--rank", "2", "--world-size", "2"], "--rank: must be in 0..1"),
        (["--role", "leader", "--world-size", "0"], "--world-size: must be >= 1"),
        (["--role", "leader", "--master", "nohost"], "--master: expected HOST:PORT"),
        (["--role", "leader", "--port", "70000"], "--port: must be 0..65535"),
        (["--role", "leader", "--health-port", "-1"], "--health-port: must be 0..65535"),
        (["--role", "leader", "--collective-timeout", "0"], "--collective-timeout: must be > 0"),
    ],
)
def test_node_flag_errors_name_the_flag(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodeSettings.from_flags(build_parser().parse_args(flags))


def test_up_refuses_workers_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`unitgate up` hosts the gateway in its own process: more workers would be ignored."""
    from gateway.launcher.up.main import run_up

    two = config_from_dict(
        {"gateway": {"models": ["m"], "workers": 2}, "units": [unit("u0", 8101)]}
    )
    assert run_up(two) == 2
    assert "[gateway].workers = 2" in capsys.readouterr().err
