"""What holds the tensors a leaking loop keeps, and the line that adds to it.

`find_holder` walks the referrers of a few retained tensors upward, one `gc.get_referrers`
scan per level, through lists, dicts, tuples, sets and deques, until it reaches something
with a name: a local variable of a target frame on the stack, a global of a target module,
or an attribute of an object (`self.history (list) of Trainer`). A tensor that is itself held
by such a name counts when it carries an autograd graph (a running `total += loss` keeps
every step's graph through one tensor). Where several names hold the same tensors (`losses`,
which keeps every step, and `recent = losses[-3:]`, which keeps three), each is measured by
the tensors it reaches (`Holder.reach`) and the one reaching the most is named: the stage then
checks, from one check to the next, that the named holder's reach grows.

`GrowthTracer` then traces one step of the target's own frames and checks, at every line, the
lengths of the containers on that chain: the line after which one grew is where the loop
adds to it (`losses.append(loss)`), which is what the fix has to change.
"""

from __future__ import annotations

import collections
import gc
import itertools
import sys
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from collections.abc import Iterator
from typing import Any

import torch

from ...common.frames import relative
from .frame_index import FrameIndex, Site, graphs_size
from .graph_span import steps_held
from ...harness.heap import attributes, instance_dict, is_a, module_file, module_globals, skipped

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
# The gate's own objects, under the name its modules run as (its own, or a run's copy).
_OWN_ROOT = __name__.split(".")[0] + "."
_CO_OPTIMIZED = 0x0001  # a function frame: its f_locals is a snapshot, not a namespace
MAX_LEVELS = 5
MAX_FRONTIER = 200
EXTRA_LEVELS = 2  # levels searched past the first named holder
MAX_REACH = 100_000  # objects walked to count what a holder reaches
MAX_ITEMS = 4096  # items of a named container read for the graphs they keep


@dataclass
class Holder:
    kind: str  # "local", "global" or "attribute"
    name: str
    owner: str  # function, module path or class name
    path: str
    line: int
    held_type: str
    containers: list[Any] = field(default_factory=list)  # innermost first
    graph: bool = False
    tensor: Any = None  # one held tensor, to look up where it was created; dropped after
    keys: list[str] = field(default_factory=list)  # outermost first: `[<int>]`, `["embeddings"]`
    steps: int | None = None  # for a held graph: the distinct steps its nodes come from
    reach: int | None = None  # tensors reachable from it through its containers (MAX_REACH at most)

    def reference(self) -> str:
        """The reference chain from the named root down to the tensor:
        `ClassificationTracker._outputs[<int>]["embeddings"]`."""
        root = f"{self.owner}.{self.name}" if self.kind == "attribute" else self.name
        return root + "".join(self.keys)

    def describe(self) -> str:
        what = f"{self.held_type}"
        if self.kind == "local":
            return f"local `{self.name}` ({what}) in `{self.owner}()`"
        if self.kind == "global":
            return f"module global `{self.name}` ({what}) in `{self.path}`"
        return f"`self.{self.name}` ({what}) of `{self.owner}`"

    def record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "owner": self.owner,
            "path": self.path,
            "line": self.line,
            "held_type": self.held_type,
            "chain": [type(c).__name__ for c in self.containers],
            "graph": self.graph,
            "description": self.describe(),
            "reference": self.reference(),
            "steps": self.steps,
            **({"reach": self.reach} if self.reach is not None else {}),
        }


def target_stack(frames: FrameIndex) -> list[FrameType]:
    out = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frames.is_target(frame.f_code):
            out.append(frame)
        frame = frame.f_back
    return out


def find_holder(samples: list[torch.Tensor], stack: list[FrameType], frames: FrameIndex, step_nodes: int = 0, marks: list[int] | None = None) -> Holder | None:
    """The named thing that holds (through containers) one of `samples`, else a named tensor
    whose autograd graph spans several steps (`step_nodes`: one step's graph size)."""
    found = find_holders(samples, stack, frames, step_nodes, marks)
    return found[0] if found else None


def find_holders(samples: list[torch.Tensor], stack: list[FrameType], frames: FrameIndex, step_nodes: int = 0, marks: list[int] | None = None) -> list[Holder]:
    """Every named thing found holding `samples` at the nearest level up, the one reaching
    the most tensors first (each with its `reach`); else the named graph `_direct` finds."""
    snapshots = [(f, f.f_locals) for f in stack if f.f_code.co_flags & _CO_OPTIMIZED]
    try:
        found = _search(samples, snapshots, frames)
        if not found:
            direct = _direct(snapshots, frames, step_nodes, marks)
            return [direct] if direct is not None else []
        for holder in found:
            holder.reach = reach(holder.containers[-1]) if holder.containers else 1
        return sorted(found, key=lambda h: -(h.reach or 0))
    finally:
        # The locals snapshots would otherwise keep this step's tensors alive.
        for _, snapshot in snapshots:
            if type(snapshot) is dict:
                snapshot.clear()


def reach(container: Any, max_items: int = MAX_REACH) -> int:
    """Tensors reachable from `container` through nested lists, dicts, tuples, sets and deques."""
    return sum(1 for _ in _tensors_in(container, max_items))


def _tensors_in(container: Any, max_items: int) -> Iterator[torch.Tensor]:
    """The tensors inside `container` (through nested lists, dicts, tuples, sets and deques),
    each object visited once, at most `max_items` objects."""
    todo: list[Any] = [container]
    seen: set[int] = set()
    while todo and len(seen) < max_items:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if is_a(obj, torch.Tensor):
            yield obj
            continue
        try:  # a container subclass's own iteration is the target's code
            if is_a(obj, dict):
                todo.extend(dict.values(obj))
            elif is_a(obj, _CONTAINERS):
                todo.extend(obj)
        except Exception:  # noqa: BLE001 - not read, counted
            skipped("containers")
    todo.clear()


def _search(samples: list[torch.Tensor], snapshots: list[tuple[FrameType, Any]], frames: FrameIndex) -> list[Holder]:
    """The named holders of `samples`: those at the nearest level up, and those up to
    `EXTRA_LEVELS` further (an attribute's list is reached a level or two after a local that
    holds a slice of it)."""
    return _ReferrerSearch(samples, snapshots, frames).run(samples)


class _ReferrerSearch:
    """One walk up the referrers of a few tensors, a `gc.get_referrers` scan per level. Every
    container the walk itself builds is in `mine`, so that it is never taken for the target's."""

    def __init__(self, samples: list[torch.Tensor], snapshots: list[tuple[FrameType, Any]], frames: FrameIndex) -> None:
        self.frames = frames
        self.locals_of: dict[int, tuple[str, FrameType]] = {}  # id(value) -> the local naming it, and its frame
        for frame, snapshot in snapshots:
            for name, value in list(snapshot.items()):
                self.locals_of.setdefault(id(value), (name, frame))
        self.modules = _target_module_dicts(frames)
        self.foreign_modules = {id(g) for g in map(module_globals, list(sys.modules.values())) if g is not None} - set(self.modules)
        # For each object reached: the sample it leads to and the containers in between.
        self.chains: dict[int, tuple[torch.Tensor, list[Any]]] = {id(s): (s, []) for s in samples}
        self.hits: list[Holder] = []
        self.mine: set[int] = {id(samples), id(snapshots), id(self.locals_of), id(self.chains), id(self.modules), id(self.foreign_modules), id(self.hits)}
        self.mine |= {id(s) for _, s in snapshots}

    def run(self, samples: list[torch.Tensor]) -> list[Holder]:
        """Level by level up from `samples`, until `EXTRA_LEVELS` past the first level with a
        named holder, `MAX_LEVELS` in all, or nothing further refers to the level."""
        level: list[Any] = list(samples)
        self.mine.add(id(level))
        first_hit: int | None = None
        for depth in range(MAX_LEVELS):
            if first_hit is not None and depth > first_hit + EXTRA_LEVELS:
                break
            before = len(self.hits)
            self._named_by_locals(level)
            level = self._level_up(level)
            if len(self.hits) > before and first_hit is None:
                first_hit = depth
            if not level:
                break
        return _distinct(self.hits)

    def _named_by_locals(self, level: list[Any]) -> None:
        """The containers of `level` a local variable of a target frame names (a sample a local
        names directly is the loop's own tensor, not a holder)."""
        for obj in level:
            sample, chain = self.chains[id(obj)]
            hit = self.locals_of.get(id(obj))
            if hit is not None and chain:
                name, frame = hit
                code = frame.f_code
                path = relative(code.co_filename, self.frames.root)
                self.hits.append(Holder("local", name, code.co_name, path, code.co_firstlineno, _held_type(obj), chain, _has_graph(sample), sample, chain_keys(chain, sample)))

    def _level_up(self, level: list[Any]) -> list[Any]:
        """One level up from `level`: the containers that refer to it (the next level), and the
        module globals and attributes naming it (added to the hits)."""
        referrers = gc.get_referrers(*level)
        next_level: list[Any] = []
        chains = self.chains
        self.mine |= {id(referrers), id(next_level)}
        self.mine |= {id(v) for v in chains.values()} | {id(v[1]) for v in chains.values()}
        for ref in referrers:
            if id(ref) in self.mine or id(ref) in chains or is_a(ref, (FrameType, type)):
                continue
            child = next((o for o in level if _refers(ref, o)), None)
            if child is not None:
                self._take(ref, child, next_level)
        referrers.clear()
        return next_level

    def _take(self, ref: Any, child: Any, next_level: list[Any]) -> None:
        """What `ref`, which refers to `child`, is: the globals of a target module (a named
        holder) or of another one (passed over), a container (the next level up, while the
        frontier has room), or an object whose attribute holds `child` (a named holder)."""
        sample, chain = self.chains[id(child)]
        if type(ref) is dict and id(ref) in self.modules:
            if chain:
                module = self.modules[id(ref)]
                name = next((str(k) for k, v in ref.items() if v is child), "?")
                path = relative(module.__file__ or "", self.frames.root)
                self.hits.append(Holder("global", name, module.__name__, path, 1, _held_type(child), chain, _has_graph(sample), sample, chain_keys(chain, sample)))
            return
        if id(ref) in self.foreign_modules:
            return
        if is_a(ref, _CONTAINERS):
            if len(next_level) < MAX_FRONTIER:
                self.chains[id(ref)] = (sample, [*chain, ref])
                next_level.append(ref)
            return
        if type(ref).__module__.startswith(_OWN_ROOT):
            return
        held, links = _attribute(ref, child, sample, chain)
        if held is not None and links:
            path, line = _class_site(type(ref), self.frames)
            self.hits.append(Holder("attribute", held[0], type(ref).__qualname__, path, line, _held_type(held[1]), links, _has_graph(sample), sample, chain_keys(links, sample)))


def _distinct(hits: list[Holder]) -> list[Holder]:
    """One holder per name (the first found: its chain is the shortest)."""
    seen: set[str] = set()
    out = []
    for holder in hits:
        if holder.describe() not in seen:
            seen.add(holder.describe())
            out.append(holder)
    return out


def chain_keys(containers: list[Any], tensor: Any) -> list[str]:
    """How each container (innermost first) reaches the next object down, outermost first:
    a dict key as `["name"]` or `[<int>]`, a list or deque position as `[<int>]`."""
    keys: list[str] = []
    child = tensor
    for container in containers:
        keys.append(_key_of(container, child))
        child = container
    return keys[::-1]


def _key_of(container: Any, child: Any) -> str:
    if is_a(container, dict):
        key = next((k for k, v in container.items() if v is child), None)
        if is_a(key, str):
            return f'["{key}"]'
        return f"[<{type(key).__name__}>]" if key is not None else "[?]"
    if is_a(container, (list, tuple, collections.deque)):
        return "[<int>]"
    return "{<item>}"


def live_tensors_with(storage_keys: set[int], limit: int = 12) -> list[torch.Tensor]:
    """Live tensors whose storage is one of `storage_keys`, from one scan of the objects the
    collector tracks. The tensor an operator first returned is often gone (`x.detach()` keeps
    the storage through a new tensor object), while what the loop keeps is a view of it."""
    found: list[torch.Tensor] = []
    objects = gc.get_objects()
    try:
        for obj in objects:
            # type(), not isinstance(): a lazy module proxy answers __class__ with a warning.
            if issubclass(type(obj), torch.Tensor):
                try:
                    key = obj.untyped_storage()._cdata
                except Exception:  # noqa: BLE001 - sparse, meta or subclass tensors have no plain storage
                    continue
                if key in storage_keys:
                    found.append(obj)
                    if len(found) >= limit:
                        break
    finally:
        objects.clear()
    return found


def _direct(snapshots: list[tuple[FrameType, Any]], frames: FrameIndex, step_nodes: int, marks: list[int] | None) -> Holder | None:
    """A single tensor bound to a name that keeps the autograd graph of several steps alive
    (a running `total = total + loss`): the largest such graph, at least three steps' worth."""
    found = _graph_candidates(snapshots, frames, step_nodes, factor=3, marks=marks)
    return found[0][1] if found else None


def named_graphs(stack: list[FrameType], frames: FrameIndex, step_nodes: int, factor: int = 2, marks: list[int] | None = None) -> list[tuple[int, Holder]]:
    """Tensors bound to a name (a local of a target frame, an attribute of an object one
    holds, a global of a target module) whose autograd graph is at least `factor` steps'
    worth of nodes, largest first. A graph that keeps growing from one check to the next
    is memory the loop never releases, though no tensor bytes show it (backward frees the
    saved tensors, not the nodes)."""
    snapshots = [(f, f.f_locals) for f in stack if f.f_code.co_flags & _CO_OPTIMIZED]
    try:
        return _graph_candidates(snapshots, frames, step_nodes, factor, marks)
    finally:
        for _, snapshot in snapshots:
            if type(snapshot) is dict:
                snapshot.clear()


def _graph_candidates(snapshots: list[tuple[FrameType, Any]], frames: FrameIndex, step_nodes: int, factor: int, marks: list[int] | None = None) -> list[tuple[int, Holder]]:
    """Named tensors whose graph holds at least `factor` steps: counted as the distinct steps
    its oldest nodes come from (graph_span.py) where autograd numbers its nodes, else as
    `factor` times one step's node count."""
    if step_nodes <= 0 and not marks:
        return []
    candidates: list[tuple[int, Holder]] = []
    seen: set[int] = set()

    def consider(value: Any, make: Any) -> None:
        held = graph_tensors(value)
        if held is None or id(value) in seen:
            return
        seen.add(id(value))
        steps = steps_held(held, marks) if marks else None
        if steps is not None and steps < factor:
            return  # decided by the steps held: no node walk
        if steps is None and step_nodes <= 0:
            return
        size = graphs_size(held, limit=max(1, step_nodes) * 5000)
        if steps is not None or size >= factor * step_nodes:
            holder = make()
            holder.steps = steps
            candidates.append((size, holder))

    # `consider` calls its factory at once, so the lambdas below never outlive the loop
    # variables they read (ruff's B023 does not apply).
    for frame, snapshot in snapshots:
        code = frame.f_code
        path = relative(code.co_filename, frames.root)
        for name, value in list(snapshot.items()):
            consider(value, lambda: Holder("local", name, code.co_name, path, code.co_firstlineno, _held_type(value), [], True, value))  # noqa: B023
            attrs = attributes(value) if not is_a(value, (torch.Tensor, ModuleType, type)) else []
            for attr, held in attrs:
                owner = type(value)
                consider(held, lambda: Holder("attribute", str(attr), owner.__qualname__, *_class_site(owner, frames), _held_type(held), [], True, held))  # noqa: B023
    for module in _target_module_dicts(frames).values():
        for name, value in list(vars(module).items()):
            consider(value, lambda: Holder("global", name, module.__name__, relative(module.__file__ or "", frames.root), 1, _held_type(value), [], True, value))  # noqa: B023
    return sorted(candidates, key=lambda c: (-(c[1].steps or 0), -c[0]))


def graph_spans(stack: list[FrameType], frames: FrameIndex, marks: list[int], budget: int, followed: set[str], full: int) -> list[tuple[int, Holder]]:
    """(steps held, holder) of every tensor bound to a name (a local of a target frame, an
    attribute of an object one holds, a global of a target module) that carries an autograd
    graph, each counted by a descent of at most `budget` nodes (graph_span.py), `full` for the
    holders `followed` (by description): cheap enough for every step boundary, so that a graph
    released at every epoch's end is not sampled at one phase of the epoch only."""
    snapshots = [(f, f.f_locals) for f in stack if f.f_code.co_flags & _CO_OPTIMIZED]
    out: list[tuple[int, Holder]] = []
    seen: set[int] = set()

    def measure(value: Any, make: Any) -> None:
        held = graph_tensors(value)
        if held is None or id(value) in seen:
            return
        seen.add(id(value))
        holder = make()
        steps = steps_held(held, marks, full if holder.describe() in followed else budget)
        if steps is not None:
            out.append((steps, holder))

    try:
        # `measure` calls its factory at once (as `_graph_candidates`' `consider` does).
        for frame, snapshot in snapshots:
            code = frame.f_code
            path = relative(code.co_filename, frames.root)
            for name, value in list(snapshot.items()):
                measure(value, lambda: Holder("local", name, code.co_name, path, code.co_firstlineno, _held_type(value), [], True))  # noqa: B023
                attrs = attributes(value) if not is_a(value, (torch.Tensor, ModuleType, type)) else []
                for attr, held in attrs:
                    owner = type(value)
                    measure(held, lambda: Holder("attribute", str(attr), owner.__qualname__, *_class_site(owner, frames), _held_type(held), [], True))  # noqa: B023
        for module in _target_modules_cached(frames):
            for name, value in list(vars(module).items()):
                measure(value, lambda: Holder("global", name, module.__name__, relative(module.__file__ or "", frames.root), 1, _held_type(value), [], True))  # noqa: B023
        return out
    finally:
        for _, snapshot in snapshots:
            if type(snapshot) is dict:
                snapshot.clear()


def _refers(ref: Any, obj: Any) -> bool:
    return any(x is obj for x in gc.get_referents(ref))


def _slots(cls: type) -> list[str]:
    """The slot names `cls` and its bases declare, read from the classes as stored."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if type(slots) is str else [s for s in slots if type(s) is str] if type(slots) in (tuple, list) else []
    return names


def _slot_value(owner: Any, slot: str) -> Any:
    try:
        return object.__getattribute__(owner, slot)
    except Exception:  # noqa: BLE001 - an empty slot, or a proxy: holds nothing
        return None


def _attribute(owner: Any, child: Any, sample: Any, chain: list[Any]) -> tuple[tuple[str, Any] | None, list[Any]]:
    """((attribute name, the object it holds), containers below it) when `owner` holds
    `child` as an attribute, directly or through its instance __dict__."""
    attrs = instance_dict(owner) or {}
    if attrs is child:
        links = chain[:-1]
        below = links[-1] if links else sample
        name = next((str(k) for k, v in attrs.items() if v is below), None)
        return ((name, below) if name else None), links
    name = next((str(k) for k, v in attrs.items() if v is child), None)
    if name is None:
        name = next((slot for slot in _slots(type(owner)) if _slot_value(owner, slot) is child), None)
    return ((name, child) if name else None), chain


def held_graph_nodes(container: Any, limit: int, max_items: int = 100_000) -> int:
    """Autograd nodes kept alive by the tensors inside `container` (through nested lists,
    dicts, tuples, sets and deques), shared nodes counted once, up to `limit`."""
    tensors = [t for t in _tensors_in(container, max_items) if _has_graph(t)]
    try:
        return graphs_size(tensors, limit)
    finally:
        tensors.clear()


def graph_tensors(value: Any) -> list[torch.Tensor] | None:
    """The graph-carrying tensors a named value holds: itself, or the items of a list, tuple,
    deque or dict of them (`losses.append(loss)` keeps one step's graph per item, and no single
    tensor shows it); None where it holds none. Only the built-in containers are read (their
    own iteration runs no target code), at most MAX_ITEMS items from the newest end."""
    if _has_graph(value):
        return [value]
    kind = type(value)
    # The newest items only, without copying the rest: this runs at every step boundary.
    if kind is dict:
        items = list(itertools.islice(reversed(dict.values(value)), MAX_ITEMS))
    elif kind is collections.deque:
        items = list(itertools.islice(reversed(value), MAX_ITEMS))
    elif kind in (list, tuple):
        items = value[-MAX_ITEMS:]
    else:
        return None
    held = [item for item in items if _has_graph(item)]
    return held or None


def _has_graph(obj: Any) -> bool:
    return is_a(obj, torch.Tensor) and obj.grad_fn is not None


def _held_type(obj: Any) -> str:
    if is_a(obj, torch.Tensor):
        return "tensor with its autograd graph" if obj.grad_fn is not None else "tensor"
    return type(obj).__name__


_MODULES_SEEN: dict[int, tuple[int, list[ModuleType]]] = {}  # id(frames) -> (len(sys.modules), the target's modules)


def _target_modules_cached(frames: FrameIndex) -> list[ModuleType]:
    """The target's modules, found again only when `sys.modules` changed size: read at every
    step boundary, where a walk of every module would cost more than the rest."""
    known = _MODULES_SEEN.get(id(frames))
    if known is None or known[0] != len(sys.modules):
        known = _MODULES_SEEN[id(frames)] = (len(sys.modules), list(_target_module_dicts(frames).values()))
    return known[1]


def _target_module_dicts(frames: FrameIndex) -> dict[int, ModuleType]:
    out = {}
    for module in list(sys.modules.values()):
        stored, path = module_globals(module), module_file(module)
        if stored is not None and path and frames.is_target_path(path):
            out[id(stored)] = module
    return out


def _class_site(cls: type, frames: FrameIndex) -> tuple[str, int]:
    name = cls.__dict__.get("__module__")
    module = sys.modules.get(name) if type(name) is str else None
    path = module_file(module) or ""
    if path and frames.is_target_path(path):
        for value in list(cls.__dict__.values()):
            code = getattr(value, "__code__", None)
            if code is not None:
                return relative(path, frames.root), code.co_firstlineno
        return relative(path, frames.root), 1
    return path, 0


class GrowthTracer:
    """Traces the target's frames for one step and notes the line after which each watched
    container got longer."""

    def __init__(self, frames: FrameIndex, containers: list[Any]) -> None:
        self.frames = frames
        self.containers = containers
        self.lengths = [len(c) for c in containers]
        self.growth: dict[int, Site] = {}
        self.last: Site | None = None
        self.armed: list[FrameType] = []

    def arm(self, stack: list[FrameType]) -> bool:
        if sys.gettrace() is not None:
            return False  # a debugger or coverage owns tracing: leave it alone
        for frame in stack:
            frame.f_trace = self._local
            frame.f_trace_lines = True
            self.armed.append(frame)
        sys.settrace(self._global)
        return True

    def disarm(self) -> dict[int, Site]:
        sys.settrace(None)
        # Growth since the last traced line of the target's: a container of code outside the
        # target (a framework's list of step outputs) grows after the target's code handed it
        # the value, at that line (the `return` of a `training_step`).
        self._check()
        for frame in self.armed:
            frame.f_trace = None
            if frame.f_code.co_flags & _CO_OPTIMIZED:
                snapshot = frame.f_locals
                if type(snapshot) is dict:
                    snapshot.clear()
        self.armed = []
        self.containers = []
        return self.growth

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and self.frames.is_target(frame.f_code):
            self.armed.append(frame)
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event in ("line", "return"):
            self._check()
            if event == "line":
                self.last = self.frames.site(frame)
        return self._local

    def _check(self) -> None:
        for index, container in enumerate(self.containers):
            try:
                size = len(container)
            except TypeError:
                continue
            if size > self.lengths[index] and self.last is not None and index not in self.growth:
                self.growth[index] = self.last
            self.lengths[index] = size
