"""`unitgate up` gives the gateway the tokenizer of its builtin units' GGUF models, so their
prompts' ids are exact: the files are written by a child process (`up` never imports torch),
and the ids the gateway computes from them are the engine's own."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Config, config_from_dict
from gateway.kvevents.prompts import PromptTokens
from gateway.launcher.up.kv_events import tokenizer_path, with_kv_events
from gateway.launcher.up.plan import plan_units
from gateway.launcher.up.tokenizers import export_tokenizers
from tests.gateway.kvevents.test_prompts import MESSAGE  # conversations as vLLM gets them

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}


def up_config(kv: Path, *units: dict[str, Any], **routing: Any) -> Config:
    """The config as `up` runs it: its units' KV events in `kv` (main._with_kv)."""
    loaded = config_from_dict(
        {"gateway": {"models": ["m", "t"]}, "units": list(units), "routing": routing}
    )
    return with_kv_events(loaded, plan_units(loaded), kv)


def builtin(uid: str, port: int, model: str, served: str = "m") -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    return {"id": uid, "leader": url, "nodes": [url], "model": model, "models": [served]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    import asyncio

    kv = tmp_path_factory.mktemp("kv")
    cfg = up_config(kv, builtin("s0", 8401, "smollm2"), builtin("t0", 8402, "tiny", served="t"))
    return asyncio.run(export_tokenizers(cfg, plan_units(cfg), kv, ENV)), kv


def test_a_gguf_units_tokenizer_is_written_and_named_for_its_model(
    exported: tuple[Config, Path],
) -> None:
    cfg, kv = exported
    folder = tokenizer_path(kv, "s0")
    assert (folder / "tokenizer.json").is_file() and (folder / "chat_template.jinja").is_file()
    assert cfg.routing.tokenizers == {"m": str(folder)}  # tiny's bytes: no folder to give


@pytest.fixture(scope="module")
def both(exported: tuple[Config, Path]) -> tuple[PromptTokens, Any]:
    from engine.model.gguf import GGUFFile, gguf_path, gguf_tokenizer

    cfg, _ = exported
    return PromptTokens(Path(cfg.routing.tokenizers["m"])), gguf_tokenizer(
        GGUFFile(gguf_path("smollm2"))
    )


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(MESSAGE, min_size=1, max_size=5))
def test_the_gateways_ids_are_the_engines(
    both: tuple[PromptTokens, Any], messages: list[dict[str, Any]]
) -> None:
    ours, engine = both
    assert list(ours.chat(messages) or []) == list(engine.apply_chat_template(messages))


async def test_the_configs_own_tokenizer_is_kept_and_a_failed_export_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "tokenizer.json").write_text("{}")
    kept = up_config(tmp_path, builtin("s0", 8401, "smollm2"), tokenizers={"m": str(theirs)})
    done = await export_tokenizers(kept, plan_units(kept), tmp_path, ENV)
    assert done.routing.tokenizers == {"m": str(theirs)}
    assert not tokenizer_path(tmp_path, "s0").exists()  # nothing was written for it
    missing = up_config(tmp_path, builtin("g0", 8403, str(tmp_path / "none.gguf")))
    with caplog.at_level(logging.INFO, "unitgate.up"):
        done = await export_tokenizers(missing, plan_units(missing), tmp_path, ENV)
    assert done.routing.tokenizers == {}
    (record,) = caplog.records
    assert "unit g0: its tokenizer's files could not be written" in record.message


def test_up_never_imports_torch() -> None:
    probe = "import sys, gateway.launcher.up.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], env=ENV, check=False).returncode == 0
