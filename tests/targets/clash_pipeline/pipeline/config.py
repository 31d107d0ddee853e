"""Stands where traingate's own `pipeline.config` used to be found: it must never be imported by
the gate. It leaves a marker, then raises."""

import os
from pathlib import Path

if os.environ.get("CLASH_MARKER_DIR"):
    Path(os.environ["CLASH_MARKER_DIR"], f"pipeline.config.{os.getpid()}").write_text("imported\n")

raise RuntimeError("the target's pipeline/config.py was imported")
