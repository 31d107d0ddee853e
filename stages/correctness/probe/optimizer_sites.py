"""Where each optimizer was built: the line of the target that constructed it (a finding about
parameters an optimizer left out points there).

`Optimizer.__init__` is wrapped while the run lasts; the frames of the constructor chain
(`super().__init__` of an optimizer class the target wrote) are skipped, so the line is the
one that built the optimizer, not its class's own.
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any

from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original


class OptimizerSites:
    def __init__(self, sites: SiteTable) -> None:
        self.sites = sites
        self.built: ObjectMap[int | None] = ObjectMap(keep_alive=False)

    def install(self, torch: Any) -> None:
        original = torch.optim.Optimizer.__init__

        @functools.wraps(original)
        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            call_original(original, optimizer, *args, **kwargs)
            if optimizer not in self.built:
                self.built[optimizer] = self._builder(optimizer)

        torch.optim.Optimizer.__init__ = init

    def _builder(self, optimizer: Any) -> int | None:
        frame: FrameType | None = sys._getframe(2)
        while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is optimizer:
            frame = frame.f_back
        while frame is not None and not self.sites.is_target(frame.f_code.co_filename):
            frame = frame.f_back
        return None if frame is None else self.sites.intern(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)

    def site(self, optimizer: Any) -> int | None:
        return self.built.get(optimizer)
