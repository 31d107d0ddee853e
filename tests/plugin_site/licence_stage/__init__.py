"""A team's own stage, installed from a package of its own through traingate's entry point.

It checks that the target's tree holds a licence file (its configuration section names which
files count), and records, from inside the training function's run, which of the target's own
modules the run imported (its instrument, `licence_stage.probe:ImportedModules`). It brings its
own category (`missing-licence`), rule, configuration section, details model, page template and
payload model; traingate's `pipeline/` and `reports/` know none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from traingate.pipeline.model.rules import Blocks, Rule
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Location, Metric, Severity, StageOutcome
from traingate.stages.base import run_entrypoint

MISSING_LICENCE = Category("missing-licence")
IMPORTS = "licence_stage.probe:ImportedModules"

RULES = (
    Rule(
        MISSING_LICENCE, "licence", Severity.HIGH,
        "the target's tree holds no licence file",
        "Looks for the files `[tool.traingate.licence] files` names in the target's root.",
        "The files of the target's copy, as the stage found them.",
        Blocks.POLICY,
        "Code without a licence cannot be reused or shipped.",
        "Add one of the licence files named in the finding.",
    ),
)


class LicenceConfig(BaseModel):
    """`[tool.traingate.licence]`."""

    model_config = ConfigDict(extra="forbid")
    files: list[str] = Field(default_factory=lambda: ["LICENSE", "COPYING"], min_length=1)


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


class LicenceStage:
    name = "licence"
    order = 50
    rules = RULES
    categories = frozenset({MISSING_LICENCE})
    config_model = LicenceConfig
    details_model = LicenceDetails
    template = Path(__file__).with_name("page.md.j2")
    payload_models = {IMPORTS: ImportsPayload}
    purpose = "observe"

    def run(self, ctx: Any) -> StageOutcome:
        config = ctx.section(LicenceConfig)
        found = next((name for name in config.files if (ctx.root / name).is_file()), None)
        run = run_entrypoint(ctx, label="imports", instruments=[IMPORTS])
        payload = run.payload(IMPORTS, ImportsPayload)
        details = LicenceDetails(looked_for=config.files, found=found, imported=payload.modules if payload else [])
        findings = []
        if found is None:
            findings.append(ctx.finding(
                category=MISSING_LICENCE,
                title=f"No licence file: none of {', '.join(config.files)} is in the target's root",
                location=Location(path="."),
                problem=f"The target's root holds none of {', '.join(config.files)}.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="looked for " + ", ".join(config.files), data={"looked_for": config.files}),
                key="licence",
            ))
        return StageOutcome(
            summary=f"licence {'found: ' + found if found else 'missing'}; the run imported {len(details.imported)} module(s) of the target",
            metrics=[Metric(id="imported.modules", name="target modules imported", value=len(details.imported))],
            findings=findings,
            details=details.model_dump(mode="json"),
        )
