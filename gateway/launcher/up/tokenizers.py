"""The tokenizer files of the local builtin units' GGUF models, so the gateway computes their
prompts' ids exactly and routes by their KV events (docs/routing.md).

`python -m engine.model.export DIR --tokenizer-only` writes each into the run's KV folder
(kv_events.tokenizer_path) while the units start: a child process, since reading a GGUF file
imports torch, which takes seconds that `up` itself never pays. The ids are the engine's own
(the same tokenizer and chat template; tests/engine/test_up_tokenizers.py checks it). A unit
whose files cannot be written in time is routed by the approximate prefix hash, said once in
the log; what the config's `[routing] tokenizers` names is kept.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

from gateway.api import Config, UnitConfig
from gateway.launcher.up.kv_events import gguf_units, tokenizer_path, with_kv_events
from gateway.launcher.up.plan import Plan

log = logging.getLogger("unitgate.up")

EXPORT_TIMEOUT_S = 120.0  # a GGUF's tokenizer: about 5 s on the 2-core machine


async def export_tokenizers(
    config: Config, plan: Plan, folder: Path, env: Mapping[str, str]
) -> Config:
    """The config with the tokenizers of the GGUF units publishing their KV events in
    `folder`, written there first where they are not yet."""
    served = {u.unit: u.leader.served_model for u in plan.units}
    wanted = [
        unit
        for unit in gguf_units(config, plan)
        if served[unit.id] not in config.routing.tokenizers
        and not (tokenizer_path(folder, unit.id) / "tokenizer.json").is_file()
    ]
    await asyncio.gather(*(_export(u, tokenizer_path(folder, u.id), env) for u in wanted))
    return with_kv_events(config, plan, folder)


async def _export(unit: UnitConfig, path: Path, env: Mapping[str, str]) -> None:
    args = ("-m", "engine.model.export", str(path), "--model", unit.model, "--tokenizer-only")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), EXPORT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        err = f"not written within {EXPORT_TIMEOUT_S:g} s".encode()
    except BaseException:  # `up` stopped meanwhile: the child goes too
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0 or not (path / "tokenizer.json").is_file():
        why = (err.decode(errors="replace").strip().splitlines() or ["no reason given"])[-1]
        log.info(
            "unit %s: its tokenizer's files could not be written (%s), so its prompts are "
            "routed by the approximate prefix hash",
            unit.id,
            why,
        )
