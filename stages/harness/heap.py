"""Reading the target's objects without running the target's code.

The probes walk what the target's process holds (the collector's objects, a frame's locals,
referrers, attributes) and meet whatever Python allows there: a `weakref.proxy` whose object
is gone (every attribute read raises `ReferenceError`), a class whose `__class__`,
`__getattr__`, `__len__` or `__eq__` raises, lazy or fake modules in `sys.modules`. So:

- a kind is told by `type(obj)`, which asks the object nothing (`isinstance` falls back on
  `obj.__class__`, which a proxy forwards and a property may raise from);
- an object's attributes are read from its `__dict__` as stored, not through `vars()`;
- a call into an object (`named_parameters()` of a module subclass) that raises skips that
  object, and the skip is counted (`SKIPPED`), never passed on to the target.
"""

from __future__ import annotations

import gc
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

SKIPPED: dict[str, int] = {}  # what a scan could not read, by what it tried: reported, never raised


def skipped(what: str) -> None:
    SKIPPED[what] = SKIPPED.get(what, 0) + 1


def is_a(obj: Any, cls: type | tuple[type, ...]) -> bool:
    """`isinstance(obj, cls)` by the object's real type alone."""
    try:
        return issubclass(type(obj), cls)
    except Exception:  # noqa: BLE001 - a metaclass's __subclasscheck__ may raise: not one of them
        return False


def instance_dict(obj: Any) -> dict[Any, Any] | None:
    """The `__dict__` `obj` stores its attributes in; None where it has no plain one."""
    try:
        stored = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__, or a dead proxy: nothing to read
        return None
    if type(stored) is not dict:
        skipped("attributes")
        return None
    return stored


def attributes(obj: Any) -> list[tuple[Any, Any]]:
    """The instance attributes `obj` stores in its `__dict__`."""
    stored = instance_dict(obj)
    return list(stored.items()) if stored is not None else []


def live(cls: type[T]) -> list[T]:
    """Every object the collector tracks whose type is `cls` or a subclass of it."""
    objects = gc.get_objects()
    try:
        return [obj for obj in objects if is_a(obj, cls)]
    finally:
        objects.clear()


def roots(modules: list[Any]) -> list[Any]:
    """The modules of `modules` that are no other's submodule (whole models); a module whose
    submodules cannot be listed is taken as a root and counted."""
    children: set[int] = set()
    for module in modules:
        try:
            children.update(id(sub) for _, sub in module.named_modules() if sub is not module)
        except Exception:  # noqa: BLE001 - a module subclass that fails to list its submodules
            skipped("named_modules")
    return [m for m in modules if id(m) not in children]


def named_parameters(module: Any) -> list[tuple[str, Any]]:
    """`module.named_parameters()`, or none where the module fails to list them (counted)."""
    try:
        return list(module.named_parameters())
    except Exception:  # noqa: BLE001 - a module subclass whose listing raises names nothing
        skipped("named_parameters")
        return []


def module_globals(module: Any) -> dict[str, Any] | None:
    """A module's globals, as stored; None for what is not a module (`sys.modules` may hold
    anything) or keeps no plain dict."""
    if not is_a(module, ModuleType):
        return None
    try:
        stored = object.__getattribute__(module, "__dict__")
    except Exception:  # noqa: BLE001 - a module subclass may refuse
        skipped("module")
        return None
    return stored if type(stored) is dict else None


def module_file(module: Any) -> str | None:
    """A module's `__file__`, read from its globals (a lazy module's `__getattr__` is not run)."""
    stored = module_globals(module)
    path = stored.get("__file__") if stored is not None else None
    return path if type(path) is str else None
