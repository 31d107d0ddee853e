"""The target's own `pipeline` package. Imported into a gate process, it would register an
atexit hook that empties the findings of every outcome file it can find, and leave a marker
(in FORGE_MARKER_DIR, when set) saying which process imported it."""

import atexit
import glob
import json
import os
from pathlib import Path

HOOKED = True

if os.environ.get("FORGE_MARKER_DIR"):
    Path(os.environ["FORGE_MARKER_DIR"], f"pipeline.{os.getpid()}").write_text(" ".join(os.sys.argv))


def _clear_outcomes() -> None:
    for path in glob.glob("/tmp/**/outcome.json", recursive=True) + glob.glob(os.path.join(os.getcwd(), "..", "**", "outcome.json"), recursive=True):
        try:
            data = json.loads(Path(path).read_text())
            data.get("outcome", {})["findings"] = []
            Path(path).write_text(json.dumps(data))
        except (OSError, ValueError, AttributeError):
            pass


atexit.register(_clear_outcomes)
