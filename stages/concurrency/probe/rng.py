"""Instrument recording where the target seeds random number generators, and with what.

Two runs with the same seeds diverge when a generator is seeded from the OS's entropy
(`torch.Generator().seed()`, `torch.seed()`, `numpy.random.default_rng()`,
`random.Random()`, `random.seed()`) or with a value that changes between runs (the clock).
Recording every seeding call the target itself makes, with its value, lets the stage point
at the call that differs between two runs. torch's own internal seeding (a sampler deriving a
generator from the seeded global one) is not the target's call and is not recorded.
"""

from __future__ import annotations

import functools
import sys
from typing import Any
from collections.abc import Callable

from ...harness.heap import module_file
from ...harness.sites import SiteTable
from ...common.frames import relative
from ...harness.faults import call_original

MAX_RECORDS = 500


class RngSites:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.records: list[dict[str, Any]] = []

    def install(self, ctx: Any) -> None:
        import random

        import torch

        self.sites = SiteTable(ctx.root)
        self._patch_torch(torch)
        self._patch_random(random)
        try:
            import numpy
        except ImportError:
            return
        self._patch_numpy(numpy)

    def _record(self, api: str, seed: Any, entropy: bool) -> None:
        assert self.sites is not None
        site = self.sites.direct_caller(2)
        if site is None or len(self.records) >= MAX_RECORDS:
            return
        value = seed if isinstance(seed, (int, float, str)) or seed is None else repr(seed)[:80]
        self.records.append({"api": api, "seed": value, "entropy": entropy, "site": self.sites.site(site)})

    def _wrap(self, api: str, original: Callable[..., Any], seed_of: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            seed = seed_of(*args, **kwargs)
            recorder._record(api, seed, entropy=seed is None)
            return call_original(original, *args, **kwargs)

        return seeded

    def _patch_torch(self, torch: Any) -> None:
        recorder = self
        manual_seed = self._wrap("torch.manual_seed", torch.random.manual_seed, lambda seed, *a, **k: seed)
        torch.manual_seed = torch.random.manual_seed = manual_seed
        reseed = torch.random.seed

        @functools.wraps(reseed)
        def seed() -> int:
            value = reseed()
            recorder._record("torch.seed()", value, entropy=True)
            return int(value)

        torch.seed = torch.random.seed = seed
        torch.Generator = _traced_generator(torch, recorder)

    def _patch_random(self, random: Any) -> None:
        recorder = self
        random.seed = self._wrap("random.seed", random.seed, lambda a=None, *r, **k: a)

        class Random(random.Random):
            def __init__(self, x: Any = None) -> None:
                recorder._record("random.Random()", x, entropy=x is None)
                super().__init__(x)

        random.Random = Random

    def _patch_numpy(self, numpy: Any) -> None:
        recorder = self
        nprandom = numpy.random
        nprandom.seed = self._wrap("numpy.random.seed", nprandom.seed, lambda seed=None, *a, **k: seed)
        nprandom.default_rng = self._wrap("numpy.random.default_rng", nprandom.default_rng, lambda seed=None, *a, **k: seed)

        class RandomState(nprandom.RandomState):  # type: ignore[name-defined]  # numpy is untyped here: a runtime base class
            def __init__(self, seed: Any = None) -> None:
                recorder._record("numpy.random.RandomState()", seed, entropy=seed is None)
                super().__init__(seed)

        nprandom.RandomState = RandomState

    def collect(self) -> dict[str, Any]:
        from .payloads import RngPayload  # at collect(): no start-up cost

        assert self.sites is not None
        files = {module_file(m) or "" for m in list(sys.modules.values())}
        modules = sorted(relative(f, self.sites.root) for f in files if f.endswith(".py") and self.sites.is_target(f))
        return RngPayload.sent({"records": self.records, "target_modules": modules})


def _traced_generator(torch: Any, recorder: RngSites) -> Any:
    """`torch.Generator` whose seeding calls are recorded; an instance check still accepts
    every generator (the default one included)."""
    base = torch._C.Generator

    class _Meta(type(base)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return issubclass(sub, base)

    class Generator(base, metaclass=_Meta):  # type: ignore[misc, valid-type]
        def manual_seed(self, seed: Any) -> Any:
            recorder._record("torch.Generator.manual_seed", int(seed) if isinstance(seed, int) else repr(seed), entropy=False)
            return super().manual_seed(seed)

        def seed(self) -> int:
            value = super().seed()
            recorder._record("torch.Generator.seed()", value, entropy=True)
            return int(value)

    Generator.__module__ = base.__module__
    Generator.__qualname__ = "Generator"
    return Generator
