"""The agent process of one stage: `python -m traingate.stages.agent REQUEST_JSON`.

It runs the stage and writes the stage's outcome as JSON; the parent validates that JSON and
computes status, score and decision itself. An exception here is written out as an error
record so the parent can report it; the parent fails closed on anything else.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from traingate.pipeline.config import TargetConfig
from traingate.stages.base import StageContext
from traingate.stages.harness import guard
from traingate.stages.harness.entrypoint import resolve


def main() -> None:
    guard.install()
    request = json.loads(Path(sys.argv[1]).read_text())
    out = Path(request["out"])
    try:
        stage = resolve(request.get("registry", "traingate.pipeline.registry:build_registry"))()[request["stage"]]
        ctx = StageContext(
            stage=request["stage"],
            root=Path(request["root"]),
            config=TargetConfig.model_validate(request["config"]),
            device=request["device"],
            deadline=float(request["deadline"]),
            scratch=Path(request["scratch"]),
            margin_s=float(request.get("margin_s", 5.0)),
            baseline=request.get("baseline"),
        )
        payload = {"outcome": stage.run(ctx).model_dump(mode="json")}
    except BaseException as exc:  # noqa: BLE001 - the parent turns this into stage-error
        payload = {"error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:]}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(out)


if __name__ == "__main__":
    main()
