"""`unitgate node --from-env lws`: the placement read from LeaderWorkerSet's variables
(gateway/base/lws.py, pure), how it meets the flags (engine/flags.py), and what the command says
when they are missing, malformed or disagree (exit 2, naming the variable and the value)."""

from __future__ import annotations

import dataclasses

import pytest

from engine import cli
from engine.flags import build_parser, explicit, place
from engine.settings import NodeSettings
from gateway.base import lws

ENV = {
    "LWS_LEADER_ADDRESS": "smollm2-0.smollm2.unitgate",
    "LWS_GROUP_SIZE": "4",
    "LWS_WORKER_INDEX": "2",
}


def settings(argv: list[str], env: dict[str, str] = ENV) -> NodeSettings:
    return NodeSettings.from_flags(place(build_parser().parse_args(argv), argv, env))


def test_read_gives_rank_world_size_and_leader() -> None:
    placement = lws.read(ENV)
    assert placement == lws.Placement("smollm2-0.smollm2.unitgate", world_size=4, rank=2)
    assert placement.role == "follower"
    assert lws.read({**ENV, "LWS_WORKER_INDEX": "0"}).role == "leader"
    assert placement.master(29500) == "smollm2-0.smollm2.unitgate:29500"
    assert lws.Placement("fd00::1", 2, 0).master(7) == "[fd00::1]:7"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LWS_GROUP_SIZE", "two", "LWS_GROUP_SIZE: expected an integer >= 1, got 'two'"),
        ("LWS_GROUP_SIZE", "0", "LWS_GROUP_SIZE: expected an integer >= 1, got '0'"),
        ("LWS_GROUP_SIZE", "-2", "LWS_GROUP_SIZE: expected an integer >= 1, got '-2'"),
        ("LWS_WORKER_INDEX", "", "LWS_WORKER_INDEX: expected an integer >= 0, got ''"),
        ("LWS_WORKER_INDEX", "1.0", "LWS_WORKER_INDEX: expected an integer >= 0, got '1.0'"),
        ("LWS_WORKER_INDEX", "4", "LWS_WORKER_INDEX: must be below LWS_GROUP_SIZE (4), got '4'"),
        (
            "LWS_LEADER_ADDRESS",
            "",
            "LWS_LEADER_ADDRESS: expected a host name or IP address, got ''",
        ),
        ("LWS_LEADER_ADDRESS", "lead:29500", "got 'lead:29500'"),
        ("LWS_LEADER_ADDRESS", "http://lead", "got 'http://lead'"),
        ("LWS_LEADER_ADDRESS", "a b", "got 'a b'"),
    ],
)
def test_a_bad_value_is_named_with_its_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        lws.read({**ENV, name: value})
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{name}: ")


@pytest.mark.parametrize("name", ["LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"])
def test_a_missing_variable_is_named(name: str) -> None:
    env = {k: v for k, v in ENV.items() if k != name}
    with pytest.raises(ValueError, match=rf"^{name}: not set"):
        lws.read(env)


def test_addresses_lws_or_a_test_may_give() -> None:
    for address in ("127.0.0.1", "::1", "smollm2-0.smollm2.unitgate", "localhost"):
        assert lws.read({**ENV, "LWS_LEADER_ADDRESS": address}).leader_address == address


def test_the_flags_get_the_placement_and_the_role_from_the_index() -> None:
    follower = settings(["--from-env", "lws", "--unit", "u"])
    assert (follower.role, follower.rank, follower.world_size) == ("follower", 2, 4)
    assert follower.master == "smollm2-0.smollm2.unitgate:29500"
    leader = settings(["--from-env", "lws"], {**ENV, "LWS_WORKER_INDEX": "0"})
    assert (leader.role, leader.rank) == ("leader", 0)
    assert settings(["--from-env", "lws", "--master-port", "7000"]).master.endswith(":7000")


def test_the_default_master_port_is_the_settings_own() -> None:
    default = next(f for f in dataclasses.fields(NodeSettings) if f.name == "master").default
    assert default == f"127.0.0.1:{lws.DEFAULT_MASTER_PORT}"


def test_flags_that_agree_with_the_environment_are_fine() -> None:
    argv = ["--from-env", "lws", "--role", "follower", "--rank", "2", "--world-size", "4"]
    argv += ["--master", "smollm2-0.smollm2.unitgate:29500"]
    assert settings(argv).rank == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rank", "3"], "--rank 3 conflicts with LWS_WORKER_INDEX=2 (--from-env lws)"),
        (["--rank", "0"], "--rank 0 conflicts with LWS_WORKER_INDEX=2"),
        (["--world-size", "2"], "--world-size 2 conflicts with LWS_GROUP_SIZE=4"),
        (["--role", "leader"], "--role leader conflicts with LWS_WORKER_INDEX=2, which makes"),
        (
            ["--master", "10.0.0.1:29500"],
            "--master 10.0.0.1:29500 conflicts with LWS_LEADER_ADDRESS=smollm2-0.smollm2.unitgate "
            "with --master-port 29500",
        ),
        (["--master-port", "70000"], "--master-port: must be 1..65535, got 70000"),
    ],
)
def test_flags_that_disagree_are_an_error_naming_both(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        settings(["--from-env", "lws", *flags])
    assert message in str(caught.value)


def test_without_from_env_the_role_is_required_and_master_port_refused() -> None:
    with pytest.raises(ValueError, match=r"^--role: required"):
        settings([])
    with pytest.raises(ValueError, match=r"^--master-port: only applies with --from-env"):
        settings(["--role", "leader", "--master-port", "29501"])
    assert settings(["--role", "leader"]).master == "127.0.0.1:29500"  # as before


def test_explicit_tells_given_flags_from_defaults() -> None:
    assert explicit(["--from-env", "lws", "--rank", "0", "--port", "8000"]) == {
        "rank": 0,
        "port": 8000,
    }
    assert explicit([]) == {}


@pytest.mark.parametrize(
    ("env", "flags", "stderr"),
    [
        (
            {**ENV, "LWS_WORKER_INDEX": "1"},
            ["--rank", "2"],
            "unitgate node: --rank 2 conflicts with LWS_WORKER_INDEX=1 (--from-env lws); "
            "drop --rank or make them agree",
        ),
        (
            {"LWS_LEADER_ADDRESS": "l", "LWS_WORKER_INDEX": "0"},
            [],
            "unitgate node: LWS_GROUP_SIZE: not set (--from-env lws reads it from what "
            "LeaderWorkerSet injects into each pod of a group)",
        ),
        (
            {**ENV, "LWS_GROUP_SIZE": "four"},
            [],
            "unitgate node: LWS_GROUP_SIZE: expected an integer >= 1, got 'four'",
        ),
    ],
)
def test_the_command_exits_2_with_one_line(
    env: dict[str, str],
    flags: list[str],
    stderr: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["--from-env", "lws", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [stderr]
