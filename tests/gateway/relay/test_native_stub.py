"""The stub, gateway/relay/native/_relay.pyi, names exactly what the built module exports: its
constants, functions and types, and each type's methods and attributes (a property where the
type has a getter, with a setter where it can be set). `Relay`, the loaded module's type,
names the same."""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable
from pathlib import Path

from gateway.relay import native

STUB = Path(native.__file__).with_name("_relay.pyi")


def stub() -> ast.Module:
    return ast.parse(STUB.read_text())


def defined(body: list[ast.stmt]) -> set[str]:
    """The names a module's or a class's body in the stub defines (its imports aside)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def public(names: Iterable[str]) -> set[str]:
    return {name for name in names if not name.startswith("_")}


def decorators(node: ast.FunctionDef) -> set[str]:
    """`property` for a getter, `setter` for a setter, none for a method."""
    found = set()
    for deco in node.decorator_list:
        if isinstance(deco, ast.Name):
            found.add(deco.id)
        elif isinstance(deco, ast.Attribute):
            found.add(deco.attr)
    return found


def test_the_stub_names_what_the_module_exports() -> None:
    mod = native.module()
    tree = stub()
    assert public(defined(tree.body)) == public(dir(mod))
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert classes == {name for name in public(dir(mod)) if isinstance(getattr(mod, name), type)}
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert functions == {n for n in public(dir(mod)) if callable(getattr(mod, n))} - classes
    for name in functions:
        assert isinstance(getattr(mod, name), types.BuiltinFunctionType), name
    for name in public(defined(tree.body)) - classes - functions:
        assert type(getattr(mod, name)) is int, name


def test_the_stub_names_what_each_type_has() -> None:
    mod = native.module()
    instances = {"Reader": mod.Reader(0), "Tap": mod.Tap.__new__(mod.Tap)}  # (not initialised)
    for node in stub().body:
        if not isinstance(node, ast.ClassDef):
            continue
        kind = getattr(mod, node.name)
        assert public(defined(node.body)) == public(dir(kind)), node.name
        assert "__init__" in defined(node.body) and "__init__" in vars(kind), node.name
        functions = [n for n in node.body if isinstance(n, ast.FunctionDef)]
        getters = {f.name for f in functions if "property" in decorators(f)}
        setters = {f.name for f in functions if "setter" in decorators(f)}
        for name in public(f.name for f in functions):
            descriptor = vars(kind)[name]
            if name in getters:
                assert isinstance(descriptor, types.GetSetDescriptorType), name
                try:
                    setattr(instances[node.name], name, None)
                    settable = True
                except AttributeError:
                    settable = False
                assert settable == (name in setters), name
            else:
                assert isinstance(descriptor, types.MethodDescriptorType), name


def test_relay_types_the_names_the_stub_has() -> None:
    """The module's type in gateway/relay/native/__init__.py annotates the stub's names."""
    assert set(native.Relay.__annotations__) == public(defined(stub().body))
