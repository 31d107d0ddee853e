"""A team's own stage, installed from a package of its own through traingate's entry point.

It checks that the target's tree holds a licence file (its configuration section names which
files count, its threshold under the policy how long one must be), and records, from inside the
training function's run, which of the target's own modules the run imported (its instrument,
`licence_stage.probe:ImportedModules`), a metric `traingate history` shows. It brings its own
category (`missing-licence`), rule, configuration section, threshold, history metric, details
model, page template and payload model; traingate's `pipeline/` and `reports/` know none of them,
and it imports nothing of traingate but the stage API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from traingate.stages.api import (
    Blocks,
    Category,
    Evidence,
    EvidenceKind,
    HistoryMetric,
    Location,
    Metric,
    Rule,
    Severity,
    Stage,
    StageContext,
    StageOutcome,
    Stricter,
    run_entrypoint,
)

MISSING_LICENCE = Category("missing-licence")
IMPORTS = "licence_stage.probe:ImportedModules"

RULES = (
    Rule(
        category=MISSING_LICENCE, stage="licence", severity=Severity.HIGH,
        description="the target's tree holds no licence file",
        check="Looks for the files `[tool.traingate.licence] files` names in the target's root, at least `licence_min_bytes` long.",
        measure="The files of the target's copy, as the stage found them.",
        blocks=Blocks.POLICY,
        impact="Code without a licence cannot be reused or shipped.",
        fix="Add one of the licence files named in the finding.",
    ),
)


class LicenceConfig(BaseModel):
    """`[tool.traingate.licence]`."""

    model_config = ConfigDict(extra="forbid")
    files: list[str] = Field(default_factory=lambda: ["LICENSE", "COPYING"], min_length=1)


class LicencePolicy(BaseModel):
    """Its threshold, a key of `[tool.traingate.policy]`: a shorter file is no licence. A
    larger value is stricter: the CI's value is a floor the target can only raise."""

    model_config = ConfigDict(extra="forbid")
    licence_min_bytes: Annotated[int, Stricter.HIGHER] = Field(default=1, ge=1)


class ImportsPayload(BaseModel):
    """What the instrument hands back: the target's modules the run imported."""

    model_config = ConfigDict(extra="forbid")
    modules: list[str]


class LicenceDetails(BaseModel):
    """What the stage's page shows."""

    model_config = ConfigDict(extra="forbid")
    looked_for: list[str] = []
    found: str | None = None
    imported: list[str] = []


class LicenceStage(Stage):
    name = "licence"
    order = 50
    rules = RULES
    config_model = LicenceConfig
    policy_model = LicencePolicy
    details_model = LicenceDetails
    template = Path(__file__).with_name("page.md.j2")
    payload_models = {IMPORTS: ImportsPayload}
    history_metrics = (HistoryMetric(column="Modules imported", ids=("imported.modules",)),)

    def run(self, ctx: StageContext) -> StageOutcome:
        config = ctx.section(LicenceConfig)
        min_bytes = ctx.thresholds(LicencePolicy).licence_min_bytes
        found = next((name for name in config.files if (ctx.root / name).is_file() and (ctx.root / name).stat().st_size >= min_bytes), None)
        run = run_entrypoint(ctx, label="imports", instruments=[IMPORTS])
        payload = run.payload(IMPORTS, ImportsPayload)
        details = LicenceDetails(looked_for=config.files, found=found, imported=payload.modules if payload else [])
        findings = []
        if found is None:
            findings.append(ctx.finding(
                category=MISSING_LICENCE,
                title=f"No licence file: none of {', '.join(config.files)} is in the target's root",
                location=Location(path="."),
                problem=f"The target's root holds none of {', '.join(config.files)} of at least {min_bytes} bytes.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="looked for " + ", ".join(config.files), data={"looked_for": config.files, "min_bytes": min_bytes}),
                key="licence",
            ))
        return StageOutcome(
            summary=f"licence {'found: ' + found if found else 'missing'}; the run imported {len(details.imported)} module(s) of the target",
            metrics=[Metric(id="imported.modules", name="target modules imported", value=len(details.imported))],
            findings=findings,
            details=details.model_dump(mode="json"),
        )
