"""One `test-environment` finding per need: the tests and test modules that could not run here
for want of the same package (or of the network) are one cause with one fix, so one finding
names them all, each a location (docs/contract.md, "One finding per cause")."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from traingate.pipeline.model.findings import locations_data
from traingate.pipeline.model.schema import LOCATIONS_KEY, Evidence, EvidenceKind, Finding
from traingate.stages.base import StageContext
from traingate.stages.execution.rules import TEST_ENVIRONMENT
from traingate.stages.execution.config import ExecutionPolicy

MAX_NAMED = 20


def one_per_need(ctx: StageContext, findings: list[Finding]) -> list[Finding]:
    """`findings` with the `test-environment` ones of the same need merged into one."""
    groups: OrderedDict[str, list[Finding]] = OrderedDict()
    kept: list[Finding] = []
    for f in findings:
        env = f.evidence.data.get("environment")
        if f.category is TEST_ENVIRONMENT and isinstance(env, dict):
            groups.setdefault(_need(env), []).append(f)
        else:
            kept.append(f)
    return kept + [group[0] if len(group) == 1 else _merged(ctx, need, group) for need, group in groups.items()]


def _need(env: dict[str, Any]) -> str:
    return f"missing-package {env.get('package')}" if env.get("kind") == "missing-package" else "network"


def _merged(ctx: StageContext, need: str, group: list[Finding]) -> Finding:
    first = group[0]
    env = first.evidence.data["environment"]
    names = [str(f.evidence.data.get("nodeid") or (f.location.path if f.location else f.title)) for f in group]
    listed = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
    package = env.get("package")
    needed = repr(package) if package else "the network"
    if package:
        fix = (
            f"Install {package!r} in the CI environment if these tests must run there; otherwise make them skip without it "
            f"(`pytest.importorskip({package!r})`) or leave them out of `tests`."
        )
    else:
        fix = first.fix
    places = [f.location for f in group if f.location is not None]
    return ctx.finding(
        category=TEST_ENVIRONMENT,
        severity=first.severity,
        title=f"{len(group)} tests or test modules could not run here: they need {needed}",
        location=None,
        problem=f"{listed} could not run because they need {needed}. This is a limit of the environment the gate ran in, not a defect it found in the code.",
        impact="What these tests check was not verified in this run; the suite was incomplete."
        + (" The policy (`test_environment_blocks = true`) blocks on it." if ctx.thresholds(ExecutionPolicy).test_environment_blocks else ""),
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{len(group)} could not run here for want of {needed}",
            traceback=first.evidence.traceback,
            data={"environment": env, "tests": names, LOCATIONS_KEY: locations_data(places)},
        ),
        key=f"needs {need}",
    )
