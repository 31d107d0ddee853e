"""The target's own `pipeline` package (a common name in ML repos): importing it from the gate's
processes would run the target's code where the verdict is made. It leaves a marker to prove it
ran, in the folder named by CLASH_MARKER_DIR when that is set."""

import os
from pathlib import Path

if os.environ.get("CLASH_MARKER_DIR"):
    Path(os.environ["CLASH_MARKER_DIR"], f"pipeline.__init__.{os.getpid()}").write_text("imported\n")
