"""`[rollout]`: the defaults, its gates and hooks, errors that name the key and the value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.config import Config, ConfigError, config_from_dict
from gateway.config.builder import table
from gateway.config.rollout import MOMENTS, GateDefaults, HookConfig, RolloutConfig, from_toml


def errors_of(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        from_toml(raw)
    return caught.value.messages()


def test_the_defaults() -> None:
    config = from_toml({})
    assert config == RolloutConfig() == Config().rollout
    assert config.steps == (5, 25, 50, 100)
    assert config.step_seconds == 300.0 and config.ready_timeout == 600.0
    assert config.golden_every_step and config.hooks == {}
    assert config.gates == GateDefaults(
        min_samples=50,
        alpha=0.05,
        max_error_excess=0.01,
        latency_min_effect=0.10,
        p99_ratio=1.5,
        max_break_excess=0.01,
        finish_shift=0.10,
        guard_alpha=0.001,
    )


def test_the_gates_mirror_the_gates_settings_field_for_field() -> None:
    from gateway.rollout.gates import GateSettings

    mine = {f.name for f in dataclasses.fields(GateDefaults)}
    assert mine == {f.name for f in dataclasses.fields(GateSettings)}
    assert GateSettings(**dataclasses.asdict(GateDefaults())) == GateSettings()


def test_a_whole_section_from_toml_with_hooks() -> None:
    config = config_from_dict(
        {
            "rollout": {
                "steps": [10, 100],
                "step_seconds": 60,
                "golden_every_step": False,
                "gates": {"min_samples": 200, "alpha": 0.01, "guard_alpha": 0.0001},
                "hooks": {
                    "scale-up": {"command": ["/usr/bin/scale", "--up"], "when": ["prepare"]},
                    "notify": {"url": "https://ops.example/hook", "headers": {"X-Team": "ml"}},
                },
            }
        }
    ).rollout
    assert config.steps == (10, 100) and config.step_seconds == 60.0
    assert config.gates.min_samples == 200 and config.gates.p99_ratio == 1.5
    scale, notify = config.hooks["scale-up"], config.hooks["notify"]
    assert scale == HookConfig(command=("/usr/bin/scale", "--up"), when=("prepare",))
    assert scale.serves("prepare") and not scale.serves("done")
    assert notify.when == MOMENTS and notify.timeout == 60.0
    assert notify.headers == {"X-Team": "ml"}
    assert from_toml(table(config)) == config  # read back as its table


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"stepz": []}, "unknown key [rollout].stepz"),
        ({"steps": []}, "[rollout].steps must list at least one step, got ()"),
        ({"steps": [0, 100]}, "[rollout].steps must be percentages in (0, 100], got (0, 100)"),
        ({"steps": [5, 101]}, "[rollout].steps must be percentages in (0, 100]"),
        (
            {"steps": [50, 25, 100]},
            "[rollout].steps must be strictly increasing, got (50, 25, 100)",
        ),
        ({"steps": [25, 25, 100]}, "[rollout].steps must be strictly increasing"),
        (
            {"steps": [5, 50]},
            "[rollout].steps must end at 100 (the whole cell on the new revision)",
        ),
        ({"steps": [5.5, 100]}, "[rollout].steps[0] must be of type int, got 5.5"),
        ({"step_seconds": 0}, "[rollout].step_seconds must be a positive number, got 0.0"),
        ({"ready_timeout": -1}, "[rollout].ready_timeout must be a positive number, got -1.0"),
        ({"golden_every_step": "yes"}, "[rollout].golden_every_step must be of type bool"),
        ({"gates": {"min_samples": 0}}, "[rollout].gates.min_samples must be >= 1, got 0"),
        ({"gates": {"alpha": 0.5}}, "[rollout].gates.alpha must be in (0, 0.5), got 0.5"),
        ({"gates": {"alpha": 0}}, "[rollout].gates.alpha must be in (0, 0.5), got 0.0"),
        (
            {"gates": {"guard_alpha": 0.1}},
            "[rollout].gates.guard_alpha must be <= alpha (0.05): the guard is the stricter test",
        ),
        ({"gates": {"max_error_excess": 1}}, "[rollout].gates.max_error_excess must be in [0, 1)"),
        ({"gates": {"max_break_excess": -0.1}}, "[rollout].gates.max_break_excess must be in"),
        ({"gates": {"latency_min_effect": 0}}, "[rollout].gates.latency_min_effect must be in"),
        (
            {"gates": {"p99_ratio": 1.0}},
            "[rollout].gates.p99_ratio must be > 1 and finite, got 1.0",
        ),
        ({"gates": {"finish_shift": 1.0}}, "[rollout].gates.finish_shift must be in (0, 1)"),
        ({"gates": {"beta": 0.2}}, "beta; known keys: ["),
        ({"hooks": {"Bad Name": {"command": ["x"]}}}, "[rollout].hooks must be named by"),
        ({"hooks": {"h": 3}}, "[rollout.hooks.h] must be a table, got int"),
        ({"hooks": {"h": {"command": "x"}}}, "[rollout.hooks.h].command must be a list, got 'x'"),
        (
            {"hooks": {"h": {"command": [""]}}},
            "[rollout.hooks.h].command must be a list of non-empty",
        ),
        ({"hooks": {"h": {"command": ["x"], "env": {}}}}, "unknown key [rollout.hooks.h].env"),
        (
            {"hooks": {"h": {"url": "ftp://host/x"}}},
            "[rollout.hooks.h].url must be an http:// or https:// URL, got 'ftp://host/x'",
        ),
        (
            {"hooks": {"h": {"command": ["x"], "timeout": 0}}},
            "[rollout.hooks.h].timeout must be > 0 seconds and finite, got 0.0",
        ),
        (
            {"hooks": {"h": {"command": ["x"], "when": ["deploy"]}}},
            "[rollout.hooks.h].when must list moments of ('prepare', 'retire', 'rollback', "
            "'done'), each once, got ('deploy',)",
        ),
        ({"hooks": {"h": {"command": ["x"], "when": []}}}, "[rollout.hooks.h].when must list at"),
        (
            {"hooks": {"h": {"command": ["x"], "headers": {"X-A": "1"}}}},
            "[rollout.hooks.h].headers only applies to a url hook",
        ),
        (
            {"hooks": {"h": {"url": "http://h/", "headers": {"Content-Type": "text/plain"}}}},
            "[rollout.hooks.h].headers is set by the gateway itself",
        ),
        (
            {"hooks": {"h": {"url": "http://h/", "token_env": "UNITGATE_TEST_UNSET_TOKEN"}}},
            "[rollout.hooks.h].token_env names an environment variable that is not set",
        ),
    ],
)
def test_each_bad_value_is_named(raw: dict[str, Any], needle: str) -> None:
    found = errors_of(raw)
    assert any(needle in message for message in found), found


def test_a_hook_is_a_command_or_a_url_never_both_or_neither() -> None:
    neither = errors_of({"hooks": {"h": {"timeout": 5}}})
    assert neither == [
        "[rollout.hooks.h].command or url is required (a command to run, or a URL to POST to),"
        " got ()"
    ]
    both = errors_of({"hooks": {"h": {"command": ["x"], "url": "http://h/"}}})
    assert both == [
        "[rollout.hooks.h].url and command are both set: a hook is one or the other,"
        " got 'http://h/'"
    ]


def test_every_bad_hook_is_reported_at_once() -> None:
    found = errors_of({"hooks": {"a": {}, "b": {"command": ["x"], "timeout": -1}}})
    assert [m.split(" ")[0] for m in found] == [
        "[rollout.hooks.a].command",
        "[rollout.hooks.b].timeout",
    ]


def test_a_url_hooks_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNITGATE_TEST_HOOK_TOKEN", "s3cret")
    hook = from_toml(
        {"hooks": {"n": {"url": "http://h/", "token_env": "UNITGATE_TEST_HOOK_TOKEN"}}}
    ).hooks["n"]
    assert hook.token() == "s3cret"
    assert "s3cret" not in repr(hook)


def test_errors_of_the_whole_file_name_the_section() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"rollout": {"steps": [5, 50], "hooks": {"x": {}}}})
    assert "[rollout].steps must end at 100" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"rollout": {"hooks": {"x": {"url": "http://h/", "when": "done"}}}})
    assert str(caught.value) == "[rollout.hooks.x].when must be a list, got 'done'"
