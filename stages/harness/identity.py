"""The probes' records of the target's objects, by identity that a freed object cannot pass on.

CPython gives a freed object's id() to the next object allocated at its address: a record
keyed by id() counts a GradScaler made, dropped and made again as one scaler, or answers for
a new object with the data of a dead one. `ObjectMap` keys by id() but keeps a weak reference
beside each entry and answers only for the very object the entry was made for; the entry goes
when that object is freed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

V = TypeVar("V")
D = TypeVar("D")


class ObjectMap(Generic[V]):
    """A value per object of the target, by identity.

    Not a `weakref.WeakKeyDictionary`: that one goes through the object's own `__hash__` and
    `__eq__`, which a module or an optimizer of the target may define (a class defining
    `__eq__` alone is unhashable) and a tensor defines elementwise.

    An object that takes no weak reference is held while the map lives when `keep_alive` (its
    id() then cannot pass to another object); without it, it is not remembered at all: a probe
    of the performance stage, which measures memory, must not keep the target's objects alive.
    """

    def __init__(self, *, keep_alive: bool = True) -> None:
        self._entries: dict[int, tuple[Callable[[], Any], V]] = {}
        self._keep_alive = keep_alive

    @overload
    def get(self, obj: Any) -> V | None: ...

    @overload
    def get(self, obj: Any, default: D) -> V | D: ...

    def get(self, obj: Any, default: Any = None) -> Any:
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else default

    def __contains__(self, obj: Any) -> bool:
        entry = self._entries.get(id(obj))
        return entry is not None and entry[0]() is obj

    def __setitem__(self, obj: Any, value: V) -> None:
        key, entries = id(obj), self._entries
        entry = entries.get(key)
        if entry is not None and entry[0]() is obj:
            entries[key] = (entry[0], value)
            return

        def forget(ref: Any) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:  # not an entry made since for another object
                del entries[key]

        ref = reference(obj, forget)
        if self._keep_alive or not isinstance(ref, _Held):
            entries[key] = (ref, value)

    def pop(self, obj: Any, default: Any = None) -> Any:
        return self._entries.pop(id(obj))[1] if obj in self else default

    def values(self) -> list[V]:
        """The values of the objects still alive (a copy: an entry may go while it is read)."""
        return [value for ref, value in list(self._entries.values()) if ref() is not None]


def reference(obj: Any, callback: Callable[[Any], None] | None = None) -> Callable[[], Any]:
    """A weak reference to `obj`; for an object that takes none, a strong one called alike (that
    never calls `callback`). While it answers `obj`, no other object can have `obj`'s id()."""
    try:
        return weakref.ref(obj, callback)
    except TypeError:
        return _Held(obj)


class _Held:
    """A strong reference called like a weak one."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj
