"""The licence stage's instrument: runs inside the target's process, beside its training function."""

from __future__ import annotations

import os
import sys
from typing import Any


class ImportedModules:
    def install(self, ctx: Any) -> None:
        self.root = os.path.realpath(str(ctx.root)) if hasattr(ctx, "root") else os.path.realpath(os.getcwd())

    def collect(self) -> dict[str, Any]:
        own = []
        for name, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if path and os.path.realpath(path).startswith(self.root + os.sep):
                own.append(name)
        return {"modules": sorted(own)}
