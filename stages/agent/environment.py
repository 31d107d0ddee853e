"""`environment`: a run failed because a package the target imports is not installed here.

A `ModuleNotFoundError` for a module that is neither part of the target's tree, nor in the
standard library, nor installed (checked again here, in the interpreter the target's processes
run, never taken from the target's word) is a limit of the environment, not a crash of the
code. The finding lists every missing top-level module the target imports, read from its files
at once, says which its requirements or pyproject.toml declare, and gives the install line.
Every run of every stage that hits it builds the same finding (the same modules, the same key):
the gate shows it once per run.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext
from traingate.stages.contract.messages import ExceptionRecord
from traingate.stages.contract.pytest_events import CollectErrorEvent, DescribedException, MissingPackage
from traingate.stages.agent.declared import Declared, declared_requirements, distributions_of, normalise
from traingate.stages.agent.imports import ImportSite, is_installed, is_stdlib, own_modules, required_imports

_NO_MODULE = re.compile(r"No module named '([^']+)'")
# evidence.data["run"] of a finding raised by a call of the entrypoint (else "collection", "conftest").
ENTRYPOINT_RUN = "entrypoint"
# An exception as a run recorded it: the harness's, or pytest's (a conftest's, a collection error's).
RaisedRecord = ExceptionRecord | DescribedException | CollectErrorEvent


def missing_module(root: Path, exc: RaisedRecord | None) -> str | None:
    """The top-level module an import failure (a harness or pytest exception record) reports
    missing, when this environment lacks it and the target does not provide it; else None."""
    if exc is None or exc.type not in ("ModuleNotFoundError", "ImportError"):
        return None
    match = _NO_MODULE.search(exc.message or "")
    # pytest's records also say why an exception is the environment's (the harness's do not).
    cause = exc.environment if not isinstance(exc, ExceptionRecord) else None
    name = match.group(1) if match else (cause.module if isinstance(cause, MissingPackage) else None)
    top = str(name or "").split(".")[0]
    if not top.isidentifier() or is_stdlib(top) or top in own_modules(root) or is_installed(top):
        return None
    return top


@dataclass(frozen=True)
class MissingPackages:
    """What the target imports that this environment lacks, and what the target declares."""

    needed: list[str]  # imported by the target's code (or the one observed), sorted
    tests_only: list[str]  # imported only by its tests
    files_read: int
    files: int  # Python files of the target; more than files_read when the scan ran out of time
    sites: dict[str, list[ImportSite]] = field(default_factory=dict)
    declared: dict[str, Declared] = field(default_factory=dict)  # module -> its declaration

    def install_names(self) -> list[str]:
        return [self.declared[m].name if m in self.declared else distributions_of(m)[0] for m in self.needed]

    def install_line(self) -> str:
        return "pip install " + " ".join(shlex.quote(n) for n in self.install_names())

    def site(self, module: str) -> str:
        first = self.sites.get(module)
        return f"{first[0].path}:{first[0].line}" if first else "a dynamic import"


@functools.lru_cache(maxsize=8)
def missing_packages(root: Path, observed: str) -> MissingPackages:
    own = own_modules(root)
    sites: dict[str, list[ImportSite]] = {}
    scan = required_imports(root)
    for site in scan.sites:
        if site.module == observed or not (is_stdlib(site.module) or site.module in own):
            sites.setdefault(site.module, []).append(site)
    absent = {m: s for m, s in sites.items() if m == observed or not is_installed(m)}
    needed = sorted({observed, *(m for m, s in absent.items() if any(not x.in_tests for x in s))})
    declarations = declared_requirements(root)
    declared = {m: d for m in needed for dist in distributions_of(m) if (d := declarations.get(dist)) is not None}
    tests_only = sorted(set(absent) - set(needed))
    return MissingPackages(needed, tests_only, scan.files_read, scan.files, sites=absent, declared=declared)


def environment_finding(ctx: StageContext, exc: RaisedRecord, observed: str, what: str, location: Location | None, run: str) -> Finding:
    """One `environment` finding for a run (`what`: "The entrypoint smoke call train:train")
    that failed on the missing `observed`; located where the failure was seen."""
    found = missing_packages(ctx.root, observed)
    listed = ", ".join(f"{m} ({found.site(m)})" for m in found.needed)
    message = f"{exc.type}: {exc.message}"
    finding = ctx.finding(
        category=Category.ENVIRONMENT,
        title=f"{len(found.needed)} package(s) the target imports are not installed here: {', '.join(found.needed)}",
        location=location or _first_site(found, observed),
        problem=(
            f"{what} failed with {message[:300]}. Read from the imports of the target's Python files, {len(found.needed)} top-level "
            f"module(s) it needs are neither installed in this environment, nor in the standard library, nor part of its tree: {listed}. "
            f"{_declarations(found)}Nothing that needs them could run, so this version was not verified; this is a limit of the "
            "environment the gate ran in, not a defect found in the code."
        ),
        fix=install_advice(found),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=message[:300],
            traceback=exc.traceback or None,
            data={
                "missing": found.needed,
                "observed": observed,
                "run": run,
                "sites": {m: [f"{s.path}:{s.line}" for s in found.sites.get(m, [])[:5]] for m in found.needed},
                "declared": {m: {"spec": d.spec, "source": d.source} for m, d in found.declared.items()},
                "undeclared": [m for m in found.needed if m not in found.declared],
                "tests_only": found.tests_only,
                "install": found.install_line(),
                "python_files_read": found.files_read,
                "python_files": found.files,
            },
        ),
        key="environment " + " ".join(found.needed),
    )
    return ctx.stops_training(finding, "environment", found.needed)


def _first_site(found: MissingPackages, observed: str) -> Location | None:
    sites = found.sites.get(observed)
    return Location(path=sites[0].path, line=sites[0].line) if sites else None


def _declarations(found: MissingPackages) -> str:
    said = [f"{m} as `{d.spec}` in {d.source}" for m, d in found.declared.items()]
    undeclared = [m for m in found.needed if m not in found.declared]
    text = f"The target declares {'; '.join(said)}. " if said else "None of them is declared in a requirements file or pyproject.toml. "
    if said and undeclared:
        text += f"It does not declare {', '.join(undeclared)}. "
    if found.tests_only:
        text += f"Its tests also import {', '.join(found.tests_only)}, not installed either. "
    if found.files_read < found.files:
        text += f"Only {found.files_read} of its {found.files} Python files were read in the time allowed: the list may be incomplete. "
    return text


def install_advice(found: MissingPackages) -> str:
    fix = f"Install them in the environment the gate runs in: `{found.install_line()}`."
    sources = {d.source for d in found.declared.values()}
    if len(found.declared) == len(found.needed) and len(sources) == 1 and (source := sources.pop()).endswith(".txt"):
        fix += f" `pip install -r {source}` installs them too, with every other requirement it lists."
    undeclared = [f"{n}" if n == normalise(m) else f"{n} (for {m})" for m, n in zip(found.needed, found.install_names(), strict=True) if m not in found.declared]
    if undeclared:
        fix += f" Declare {', '.join(undeclared)} in the project's requirements or pyproject.toml so every environment gets them."
    return fix
