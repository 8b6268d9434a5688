"""The names the native relay's C uses on Python objects are the ones
gateway/relay/native/contract.py declares, and the classes have them: renaming an attribute on
either side fails here.

The C sources are read, not the built module: the names are the literals of relay.c's INTERN
calls, the modules and functions it imports at init, the connection's slots the Tap finds by
name, and the template's keys (TEMPLATE_KEYS, tracker.py's _TEMPLATE_KEYS in its order).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import types

from gateway.relay import native, tracker
from gateway.relay.native import contract


def c_sources() -> str:
    return "\n".join(path.read_text() for path in (native.SOURCE, *native.parts()))


def interned() -> dict[str, str]:
    """Each INTERN call's variable and the name it interns (a literal)."""
    return dict(re.findall(r'\bINTERN\(\s*(\w+)\s*,\s*"([^"]*)"\s*\)', c_sources()))


def declared_on(cls: type, name: str) -> bool:
    """`name` is in the __slots__ of `cls` (or a base), a class attribute, or set on self in
    its __init__."""
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if name in ((slots,) if isinstance(slots, str) else slots):
            return True
    if hasattr(cls, name):
        return True
    init = next(vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))
    if not isinstance(init, types.FunctionType):
        return False
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr == name
        for node in ast.walk(tree)
    )


def test_each_class_has_the_names_declared_for_it() -> None:
    missing = []
    for where, names in contract.TOUCHED.items():
        module, _, name = where.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls, type), where
        missing += [f"{where}.{attr}" for attr in names if not declared_on(cls, attr)]
    assert missing == []


def test_the_connections_slots_the_tap_reads_by_offset_are_plain_slots() -> None:
    where = next(w for w in contract.TOUCHED if w.endswith(".UpstreamConnection"))
    module, _, name = where.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    for slot in contract.SLOTS:
        assert slot in contract.TOUCHED[where]
        assert isinstance(getattr(cls, slot), types.MemberDescriptorType), slot


def test_the_c_sources_name_exactly_what_the_contract_declares() -> None:
    attributes = {name for names in contract.TOUCHED.values() for name in names}
    assert set(interned().values()) == attributes | set(contract.EVENT_KEYS)
    assert not attributes & set(contract.EVENT_KEYS)
    source = c_sources()
    imported = set(re.findall(r'\bPyImport_ImportModule\(\s*"([^"]+)"\s*\)', source))
    taken = set(re.findall(r'\bPyObject_GetAttrString\(\s*\w+\s*,\s*"([^"]+)"\s*\)', source))
    assert imported == set(contract.MODULES)
    assert taken == {name for names in contract.MODULES.values() for name in names}
    for module, names in contract.MODULES.items():
        assert all(hasattr(importlib.import_module(module), name) for name in names), module


def test_the_tap_finds_the_declared_slots_by_name() -> None:
    names = interned()
    found = re.findall(r"\bslot_offset\([^,]+,\s*(\w+)\s*\)", c_sources())
    assert sorted(names[var] for var in found) == sorted(contract.SLOTS)


def test_the_template_keys_are_the_trackers() -> None:
    array = re.search(r"TEMPLATE_KEYS\[N_TEMPLATE\]\s*=\s*\{([^}]*)\}", c_sources())
    assert array is not None
    keys = tuple(re.findall(r'"([^"]*)"', array.group(1)))
    assert keys == tracker._TEMPLATE_KEYS
    size = re.search(r"#define N_TEMPLATE (\d+)", c_sources())
    assert size is not None and int(size.group(1)) == len(keys)
