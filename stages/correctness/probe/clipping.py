"""Gradient clipping that clips nothing (gradient-clipping).

`torch.nn.utils.clip_grad_norm_` and `clip_grad_value_` are wrapped (in `torch.nn.utils` and
`torch.nn.utils.clip_grad`, where the target may import them from) to keep, per line, the
latest clip: the backward calls made before it and the parameters it clipped. At the next
optimizer step over any of those parameters, a backward that ran after the clip means the
gradients the step applies are not the ones clipped: the clip ran on cleared gradients
(after `zero_grad()`, before the backward) or a later backward added to what it clipped.
Only the latest clip of each line is judged, so a step a GradScaler skipped does not leave an
older clip behind to be judged against the next iteration's backward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from .causes import StepCauses
from ...harness.sites import SiteTable
from ...harness.faults import call_original

FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_")
MAX_RECORDS = 50
MAX_STEPS = 20  # step indexes listed per record


@dataclass
class _Clip:
    function: str
    site: int | None
    backwards: int  # backward calls made before it
    params: frozenset[int]
    grads_present: int  # parameters holding a gradient when it ran
    count: int


@dataclass
class _Record:
    function: str
    site: int | None
    kind: str  # "before-backward": no gradient of the coming step yet; "backward-after-clip": a later backward added to it
    backward_site: int | None  # the latest backward before the step: the one the clip should follow
    first_step: int
    steps: list[int] = field(default_factory=list)
    count: int = 0


class ClipWatch:
    def __init__(self, sites: SiteTable, causes: StepCauses) -> None:
        self.sites, self.causes = sites, causes
        self.calls = 0
        self._latest: dict[int | None, _Clip] = {}  # by line
        self._records: dict[tuple[int | None, str], _Record] = {}

    def install(self, torch: Any) -> None:
        import torch.nn.utils.clip_grad as clip_grad

        self.torch = torch
        for name in FUNCTIONS:
            wrapped = self._wrap(name, getattr(clip_grad, name))
            for module in (torch.nn.utils, clip_grad):
                setattr(module, name, wrapped)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            params = [parameters] if isinstance(parameters, self.torch.Tensor) else list(parameters)
            self.note(name, params, self.sites.innermost(1))
            return call_original(original, params, *args, **kwargs)

        return clip

    def note(self, name: str, params: list[Any], site: int | None) -> None:
        self.calls += 1
        grads = sum(1 for p in params if p.grad is not None)
        self._latest[site] = _Clip(name, site, self.causes.backwards, frozenset(id(p) for p in params), grads, self.calls)

    def judge(self, step: int, params: list[Any], previous_backwards: int) -> None:
        """At an optimizer step over `params`: the latest clips of these parameters, each judged
        once; `previous_backwards`: backward calls made before the optimizer's previous step."""
        if not self._latest:
            return
        held = {id(p) for p in params}
        for site, clip in list(self._latest.items()):
            if not clip.params & held:
                continue
            del self._latest[site]
            if self.causes.backwards == clip.backwards:
                continue  # no backward after it: the step applies what it clipped
            empty = clip.grads_present == 0 or clip.backwards == previous_backwards
            self._note(clip, "before-backward" if empty else "backward-after-clip", step)

    def _note(self, clip: _Clip, kind: str, step: int) -> None:
        key = (clip.site, kind)
        record = self._records.get(key)
        if record is None:
            if len(self._records) >= MAX_RECORDS:
                return
            record = self._records[key] = _Record(clip.function, clip.site, kind, self.causes.backward_site, step)
        record.count += 1
        if len(record.steps) < MAX_STEPS:
            record.steps.append(step)

    def collect(self) -> list[dict[str, Any]]:
        return [
            {"function": r.function, "site": r.site, "kind": r.kind, "backward_site": r.backward_site, "first_step": r.first_step, "steps": r.count, "step_indexes": r.steps}
            for r in self._records.values()
        ]
