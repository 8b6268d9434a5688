"""`unitgate up` policy without processes: config units -> node specs, restart backoff,
`unitgate node`'s flag checks (engine.settings), and the vLLM units' KV events."""

from __future__ import annotations

import logging
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.backends.vllm.args import engine_kwargs
from engine.backends.vllm.kv_events import readers as kv_readers
from engine.flags import build_parser
from engine.settings import NodeSettings
from gateway.api import is_loopback
from gateway.config import Config, config_from_dict
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.fleet import ReplicaPorts
from gateway.launcher.up.kv_events import (
    SUN_PATH_MAX,
    SocketFolder,
    fits,
    publishing_here,
    socket_folder,
    socket_paths,
    tokenizer_folder,
    untokenized,
    with_kv_events,
)
from gateway.launcher.up.plan import EngineOptions, NodeSpec, Plan, PlanError, plan_units
from gateway.launcher.up.replica import _parser as replica_parser
from gateway.launcher.up.replicas import ReplicaLauncher


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


def test_a_units_pp_reaches_every_node_and_forms_tp_x_pp() -> None:
    plan = plan_units(config(unit("u0", 8101, 8102, 8103, 8104, pp=2)))
    for node in plan.units[0].nodes:
        argv = node.argv("127.0.0.1:5000", EngineOptions())
        settings = NodeSettings.from_flags(build_parser().parse_args(argv))
        assert (settings.pp, settings.world_size) == (2, 4)
    plain = plan_units(config(unit("u0", 8101, 8102))).units[0].leader
    assert "--pp" not in plain.argv("127.0.0.1:5000", EngineOptions())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"pp": 0}, r"pp must be an integer >= 1, got 0"),
        ({"pp": "two"}, r"pp must be of type int, got 'two'"),
        ({"pp": 2}, r"pp must divide the number of nodes, 1 \(the nodes form tp x pp\), got 2"),
        (
            {"backend": "vllm", "model": "/m", "pp": 2},
            r'pp only applies to backend = "builtin".*got 2',
        ),
        ({"kind": "vllm", "pp": 2}, 'pp only applies to kind = "unitgate".*got 2'),
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


def vllm_config(tmp: Path, *units: dict[str, Any], **sections: Any) -> Config:
    """A vLLM unit on 8301-8302 serving model `m` from `tmp` (a folder with tokenizer.json),
    beside `units`."""
    (tmp / "tokenizer.json").write_text("{}")
    v0 = {**unit("v0", 8301, 8302), "backend": "vllm", "model": str(tmp)}
    return config_from_dict({"gateway": {"models": ["m"]}, "units": [v0, *units], **sections})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_up_turns_a_vllm_units_kv_events_on_and_tells_the_gateway(tmp_path: Path) -> None:
    cfg = vllm_config(tmp_path, unit("b0", 8401))
    plan = plan_units(cfg)
    assert [u.id for u in publishing_here(cfg, plan)] == ["v0", "b0"]
    kv = with_kv_events(cfg, plan, tmp_path / "kv")
    v0, b0 = kv.units
    events, replay = f"ipc://{tmp_path}/kv/v0.sock", f"ipc://{tmp_path}/kv/v0.replay.sock"
    assert (v0.kv_events, v0.kv_events_replay) == (events, replay)
    assert v0.engine_args["kv_events_config"] == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": events,  # a Unix socket: nothing listens beyond this machine
        "replay_endpoint": replay,
        "topic": "kv",
    }
    # its answers' usage says how many prompt tokens its cache held
    assert v0.engine_args["enable_prompt_tokens_details"] is True
    # the builtin unit's leader binds its own sockets (--kv-events); nothing else changes
    b0_events = (f"ipc://{tmp_path}/kv/b0.sock", f"ipc://{tmp_path}/kv/b0.replay.sock")
    assert (b0.kv_events, b0.kv_events_replay) == b0_events
    assert replace(b0, kv_events="", kv_events_replay="") == cfg.units[1]
    (leader,) = plan_units(kv).units[1].nodes
    settings = NodeSettings.from_flags(
        build_parser().parse_args(leader.argv("h:1", EngineOptions()))
    )
    assert (settings.kv_events, settings.kv_events_replay) == b0_events
    assert kv.routing.tokenizers == {"m": str(tmp_path.resolve())}
    assert untokenized(kv, plan) == []
    for node in plan_units(kv).units[0].nodes:  # leader and follower alike
        argv = node.argv("127.0.0.1:5000", EngineOptions())
        settings = NodeSettings.from_flags(build_parser().parse_args(argv))
        assert engine_kwargs(settings)["kv_events_config"] == v0.engine_args["kv_events_config"]


def test_the_configs_own_kv_settings_are_kept(tmp_path: Path) -> None:
    theirs = {"kv_events": "tcp://127.0.0.1:7000"}
    engine = {"engine_args": {"kv_events_config": {"enable_kv_cache_events": True}}}
    cfg = vllm_config(
        tmp_path,
        {**unit("v1", 8311), "backend": "vllm", "model": str(tmp_path), **theirs},
        {**unit("v2", 8321), "backend": "vllm", "model": str(tmp_path), **engine},
        routing={"tokenizers": {"m": str(tmp_path)}},
    )
    plan = plan_units(cfg)
    assert [u.id for u in publishing_here(cfg, plan)] == ["v0"]
    kv = with_kv_events(cfg, plan, tmp_path / "kv")
    v1, v2 = kv.units[1:]
    assert v1 == cfg.units[1]
    # vLLM's default endpoint, tcp://*:5557, read on loopback; no replay socket was named.
    assert (v2.kv_events, v2.kv_events_replay) == ("tcp://127.0.0.1:5557", "")
    assert v2.engine_args == cfg.units[2].engine_args
    assert kv.routing.tokenizers == {"m": str(tmp_path)}


@pytest.mark.parametrize(
    ("config", "readers"),
    [
        (
            {
                "enable_kv_cache_events": True,
                "endpoint": "ipc:///t/a",
                "replay_endpoint": "ipc:///t/b",
            },
            ("ipc:///t/a", "ipc:///t/b"),
        ),
        (
            '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", '
            '"replay_endpoint": "tcp://0.0.0.0:6001"}',
            ("tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001"),
        ),
        ({"enable_kv_cache_events": False}, None),
        ({"enable_kv_cache_events": True, "publisher": "null"}, None),
        # an endpoint vLLM connects out from (to a collector), not one it binds
        ({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:6000"}, None),
        ({"enable_kv_cache_events": True, "replay_endpoint": "tcp://10.0.0.5:6001"}, None),
        ("not json", None),
    ],
)
def test_where_the_gateway_reads_a_publisher_the_config_set_up(config: Any, readers: Any) -> None:
    assert kv_readers(config) == readers


@pytest.mark.parametrize(
    "extra",
    [
        {"engine_args": {"chat_template": "/t/chat.jinja"}},  # the gateway renders the folder's
        {"model": "HuggingFaceTB/SmolLM2-135M-Instruct"},  # a hub id: no folder here
    ],
)
def test_a_model_the_gateway_cannot_tokenize_is_said_once(
    tmp_path: Path, extra: dict[str, Any]
) -> None:
    cfg = vllm_config(tmp_path)
    cfg = replace(cfg, units=(replace(cfg.units[0], **extra),))
    plan = plan_units(cfg)
    kv = with_kv_events(cfg, plan, tmp_path / "kv")
    assert kv.units[0].kv_events and kv.routing.tokenizers == {}
    assert tokenizer_folder(kv.units[0]) is None
    (line,) = untokenized(kv, plan)
    assert line.startswith("unit v0: the gateway reads its KV events but has no tokenizer")


def test_each_unit_gets_sockets_of_its_own_with_paths_a_socket_can_bind() -> None:
    folder = Path("/r")
    assert socket_paths(folder, "v0") == (Path("/r/v0.sock"), Path("/r/v0.replay.sock"))
    odd = ["a/../b", "x" * 33, "two words", "a", "a-replay", "unit"]
    paths = [p for uid in odd for p in socket_paths(folder, uid)]
    assert len(set(paths)) == len(paths) and {p.parent for p in paths} == {folder}
    assert all(len(p.name) <= len("unit.0123456789ab.replay.sock") for p in paths)
    # 107 bytes is the most a socket's path may have (sun_path's 108, its NUL aside)
    deep = Path("/" + "d" * (SUN_PATH_MAX - len("/v0.replay.sock") - 1))
    assert fits(deep, ["v0"]) and not fits(deep / "e", ["v0"])


def test_the_socket_folder_is_the_runs_own_and_private(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "kv").mkdir(parents=True, mode=0o755)  # from an earlier run, opened up
    folder = socket_folder(run, ["v0"])
    assert folder == SocketFolder(run / "kv", owned=False) and mode(run / "kv") == 0o700
    folder.remove()  # the run's folder keeps it
    assert (run / "kv").is_dir()


def test_a_folder_too_deep_or_not_ours_falls_back_to_a_temp_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 100)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "kv").symlink_to(tmp_path)  # a symlink there is not a folder of this run's
    for run in (deep, linked):
        folder = socket_folder(run, ["v0"])
        assert folder is not None and folder.owned and mode(folder.path) == 0o700
        assert folder.path.name.startswith("unitgate-kv-") and fits(folder.path, ["v0"])
        folder.remove()
        assert not folder.path.exists()
    assert not (deep / "kv").exists()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # TMPDIR itself too deep
    deep.mkdir()
    assert socket_folder(deep, ["v0"]) is None and list(deep.iterdir()) == []


def test_child_replicas_read_the_sockets_in_the_folder_up_made(tmp_path: Path) -> None:
    cfg = vllm_config(tmp_path)
    plan = plan_units(cfg)
    folder = tmp_path / "kv"
    launcher = ReplicaLauncher(Path("up.toml"), Path("logs"), {}, "info", 30.0, None)
    argv = replace(launcher, kv_dir=folder).argv(ReplicaPorts(1, 9000, 9001))
    ns = replica_parser().parse_args(argv[argv.index("replica") + 1 :])
    assert ns.kv_dir == folder
    assert with_kv_events(cfg, plan, ns.kv_dir) == with_kv_events(cfg, plan, folder)
    assert "--kv-dir" not in launcher.argv(ReplicaPorts(1, 9000, 9001))


def test_up_leaves_kv_events_off_where_nothing_would_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.launcher.up import main

    cfg = vllm_config(tmp_path, unit("b0", 8401))
    plan = plan_units(cfg)
    run = tmp_path / "run"
    run.mkdir()
    assert main._kv_folder(cfg, plan, run) == SocketFolder(run / "kv", owned=False)
    approximate = replace(cfg, routing=replace(cfg.routing, prefix_scorer="approximate"))
    assert main._kv_folder(approximate, plan, run) is None
    builtin = config(unit("b0", 8401))  # a builtin unit publishes too
    assert main._kv_folder(builtin, plan_units(builtin), run) == SocketFolder(run / "kv", False)
    monkeypatch.setattr(main, "kv_missing", lambda: ["zmq", "msgspec"])
    with caplog.at_level(logging.INFO, "unitgate.up"):
        assert main._kv_folder(cfg, plan, run) is None
    (record,) = caplog.records
    assert "KV cache events not turned on" in record.message
    assert "zmq, msgspec missing" in record.message


def test_up_removes_a_temp_socket_folder_when_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.launcher.up import main

    cfg = vllm_config(tmp_path)
    plan = plan_units(cfg)
    ran: list[tuple[Config, Path | None]] = []

    def run_loop(config: Config, plan: Plan, run: Any) -> int:
        ran.append((config, run.fleet.kv_dir))
        assert run.fleet.kv_dir is not None and mode(run.fleet.kv_dir) == 0o700
        return 0

    monkeypatch.setattr(main, "_refusal", lambda config, options: None)
    monkeypatch.setattr(main, "_prepare", lambda config, options: (plan, main.Fleet((), None)))
    monkeypatch.setattr(main, "_run_loop", run_loop)
    logs = tmp_path / ("d" * 100)  # too deep for a socket's path: a temp folder instead
    assert main.run_up(cfg, main.UpOptions(log_dir=logs)) == 0
    ((config, kv_dir),) = ran
    assert kv_dir is not None and kv_dir.name.startswith("unitgate-kv-")
    assert config.units[0].kv_events == f"ipc://{kv_dir}/v0.sock"
    assert not kv_dir.exists() and not (logs / "kv").exists()
