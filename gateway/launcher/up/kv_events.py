"""KV cache events for the units `unitgate up` starts, so that the gateway routes each
prompt to the unit caching most of it (docs/routing.md) without a line of config.

Each local unit publishes its events, and answers replays, on two Unix sockets (`ipc://`) in a
folder of the run only its user may enter: the events carry the token ids of users' cached
prompts, and vLLM binds TCP only on every interface. A vLLM unit is told through its
engine_args (engine/backends/vllm/kv_events.py), a builtin unit's leader by `--kv-events`. The
unit's `kv_events` and `kv_events_replay` tell the gateway where to read them. The gateway also
gets a vLLM unit's tokenizer (`[routing] tokenizers`) from the unit's model folder, to compute a
prompt's ids as vLLM does. What the config sets is kept: a unit with
`kv_events` of its own is left as it is, one whose engine_args carry `kv_events_config` is
read where that publishes, and a model named in `tokenizers` keeps its folder.

The sockets' names follow from the folder and the unit's id, so a child replica handed the
folder (`--kv-dir`) computes the same config from the same file. `socket_folder` makes the
folder; the rest is pure but for reading whether a folder holds tokenizer.json.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engine.backends.vllm.kv_events import ENGINE_ARG, events_config, readers
from gateway.api import Config, UnitConfig
from gateway.launcher.up.plan import Plan

# The packaged GGUF models' names (engine.model.gguf.packaged.PACKAGED, whose package imports
# torch: `up` does not, checked by tests/engine/test_up_tokenizers.py).
GGUF_PACKAGED = ("smollm2",)
# The `kv` extra (pyproject.toml): pyzmq and msgspec read the events, tokenizers and jinja2
# compute prompt ids. The gateway's config refuses kv_events and tokenizers without them.
KV_MODULES = ("zmq", "msgspec", "tokenizers", "jinja2")
SUN_PATH_MAX = 107  # bytes of a Unix socket's path, its NUL aside (Linux's sun_path is 108)
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")  # a unit id that names its sockets as it is


@dataclass(frozen=True, slots=True)
class SocketFolder:
    """Where the units' sockets go: `kv` in the run's folder, or a temp folder of its own."""

    path: Path
    owned: bool  # a temp folder made for them (the run's too deep, or not ours): `up` removes it

    def remove(self) -> None:
        if self.owned:
            shutil.rmtree(self.path, ignore_errors=True)


def kv_missing() -> list[str]:
    """The `kv` extra's modules this interpreter lacks."""
    return [m for m in KV_MODULES if importlib.util.find_spec(m) is None]


def _local(config: Config, plan: Plan, *backends: str) -> list[UnitConfig]:
    """The config's units that `up` starts with one of `backends`, in config order."""
    local = {u.unit for u in plan.units if u.leader.backend in backends}
    return [u for u in config.units if u.id in local]


def vllm_units(config: Config, plan: Plan) -> list[UnitConfig]:
    """The config's units that `up` starts with the vLLM backend."""
    return _local(config, plan, "vllm")


def builtin_units(config: Config, plan: Plan) -> list[UnitConfig]:
    """The config's units that `up` starts with the builtin engine."""
    return _local(config, plan, "builtin")


def event_units(config: Config, plan: Plan) -> list[UnitConfig]:
    """The local units that can publish KV events: builtin and vLLM."""
    return _local(config, plan, "builtin", "vllm")


def publishing_here(config: Config, plan: Plan) -> list[UnitConfig]:
    """The local units whose config sets neither side of their events: `up` gives each its
    sockets."""
    return [
        unit
        for unit in event_units(config, plan)
        if not unit.kv_events and ENGINE_ARG not in unit.engine_args
    ]


def _name(unit_id: str) -> str:
    """The unit's name in the folder: its id where that is plain and short, else the id's hash
    (which has a dot no plain id has, so names never clash)."""
    plain = _PLAIN_ID.fullmatch(unit_id) is not None
    return unit_id if plain else "unit." + hashlib.sha256(unit_id.encode()).hexdigest()[:12]


def socket_paths(folder: Path, unit_id: str) -> tuple[Path, Path]:
    """The unit's events and replay sockets in `folder`."""
    name = _name(unit_id)
    return folder / f"{name}.sock", folder / f"{name}.replay.sock"


def tokenizer_path(folder: Path, unit_id: str) -> Path:
    """Where `up` writes a builtin unit's tokenizer files in `folder` (GGUF models:
    `export_tokenizers`)."""
    return folder / f"{_name(unit_id)}.tokenizer"


def gguf_units(config: Config, plan: Plan) -> list[UnitConfig]:
    """The local builtin units whose model is a GGUF file (the packaged SmolLM2 or a .gguf
    path) that publish KV events: `up` writes their tokenizer's files for the gateway (their
    prompt ids are the engine's: tests/engine/test_up_tokenizers.py checks it)."""
    return [
        u
        for u in builtin_units(config, plan)
        if u.kv_events and (u.model in GGUF_PACKAGED or u.model.endswith(".gguf"))
    ]


def fits(folder: Path, unit_ids: Sequence[str]) -> bool:
    """Whether every socket of these units in `folder` has a path a Unix socket can bind."""
    paths = (p for unit in unit_ids for p in socket_paths(folder, unit))
    return all(len(os.fsencode(p)) <= SUN_PATH_MAX for p in paths)


def socket_folder(run: Path, unit_ids: Sequence[str]) -> SocketFolder | None:
    """A folder only this user may enter (0o700) for these units' sockets: `kv` in the run's
    folder `run`, else (too deep for a socket's path, or not ours) a fresh temp folder. None
    when even that cannot be made or is too deep (a long TMPDIR)."""
    here = run / "kv"
    if fits(here, unit_ids) and _private(here):
        return SocketFolder(here, owned=False)
    try:
        temp = Path(tempfile.mkdtemp(prefix="unitgate-kv-"))  # made 0o700
    except OSError:
        return None
    if fits(temp, unit_ids):
        return SocketFolder(temp, owned=True)
    temp.rmdir()
    return None


def _private(folder: Path) -> bool:
    """`folder` made (or found) as a directory of this user's, then set to 0o700."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a file or a symlink there, or no right to make it
        return False
    try:
        found = os.fstat(fd)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
            return False
        os.fchmod(fd, 0o700)  # one found from an earlier run, or made under an odd umask
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


DETAILS = "enable_prompt_tokens_details"  # vLLM's server flag: cached tokens in usage


def with_kv_events(config: Config, plan: Plan, folder: Path) -> Config:
    """The config the gateways run (and the units, through their engine_args): each local vLLM
    unit publishing its events where the gateway reads them (its sockets in `folder`, unless
    its config says where), and its model's tokenizer known."""
    local = {u.id for u in vllm_units(config, plan)}
    builtin = {u.id for u in builtin_units(config, plan)}
    units = tuple(
        _unit(u, folder) if u.id in local else _builtin(u, folder) if u.id in builtin else u
        for u in config.units
    )
    served = {u.unit: u.leader.served_model for u in plan.units}
    tokenizers = dict(config.routing.tokenizers)
    for unit in units:
        held = tokenizer_folder(unit) if unit.id in local and unit.kv_events else None
        if held is not None:
            tokenizers.setdefault(served[unit.id], held)
    for unit in gguf_units(replace(config, units=units), plan):
        path = tokenizer_path(folder, unit.id)
        if (path / "tokenizer.json").is_file():  # written (export_tokenizers) before the gateway
            tokenizers.setdefault(served[unit.id], str(path))
    routing = replace(config.routing, tokenizers=tokenizers)
    return replace(config, units=units, routing=routing)


def _unit(unit: UnitConfig, folder: Path) -> UnitConfig:
    if unit.kv_events:
        return unit
    if ENGINE_ARG in unit.engine_args:
        found = readers(unit.engine_args[ENGINE_ARG])
        if found is None:
            return unit
        return replace(unit, kv_events=found[0], kv_events_replay=found[1])
    events, replay = (f"ipc://{path}" for path in socket_paths(folder, unit.id))
    # Its answers' usage then says how many prompt tokens its cache held, which the gateway
    # checks its own predictions against (docs/routing.md).
    engine_args = {DETAILS: True, **unit.engine_args, ENGINE_ARG: events_config(events, replay)}
    return replace(unit, engine_args=engine_args, kv_events=events, kv_events_replay=replay)


def _builtin(unit: UnitConfig, folder: Path) -> UnitConfig:
    """A builtin unit's leader binds where the gateway reads (`--kv-events`, plan.py); its
    answers always report their cached tokens."""
    if unit.kv_events:
        return unit
    events, replay = (f"ipc://{path}" for path in socket_paths(folder, unit.id))
    return replace(unit, kv_events=events, kv_events_replay=replay)


def tokenizer_folder(unit: UnitConfig) -> str | None:
    """The unit's Hugging Face folder (engine_args' `tokenizer`, else its model) as an absolute
    path, when it holds tokenizer.json. None for a hub id, and for a unit whose engine_args name
    a `chat_template` of its own: the gateway renders a folder's template, so its prompt ids
    for chats would not be the unit's, and every guess would miss."""
    if "chat_template" in unit.engine_args:
        return None
    named = unit.engine_args.get("tokenizer") or unit.model
    if not isinstance(named, str) or not named:
        return None
    folder = Path(named).expanduser()
    return str(folder.resolve()) if (folder / "tokenizer.json").is_file() else None


def untokenized(config: Config, plan: Plan) -> list[str]:
    """One line per local vLLM unit whose events the gateway reads but whose prompts it cannot
    tokenize (routed by the approximate prefix hash), for the log."""
    served = {u.unit: u.leader.served_model for u in plan.units}
    return [
        f"unit {u.id}: the gateway reads its KV events but has no tokenizer for model "
        f"{served[u.id]!r} (its model {u.model!r} is no local folder with tokenizer.json, or its "
        "engine_args set a chat_template): set [routing] tokenizers for exact prefix routing"
        for u in vllm_units(config, plan)
        if u.kv_events and served[u.id] not in config.routing.tokenizers
    ]
