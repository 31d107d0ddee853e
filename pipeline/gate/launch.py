"""The `traingate` command. Where an import server serves this machine's gate runs
(TRAINGATE_IMPORT_SERVER, `pipeline/gate/gate_server.py`), the command runs as a fork of
its gate server, which imported the command line once; else, or when it does not serve, here.
Only the standard library is imported before that is decided."""

from __future__ import annotations

import os
import sys

from traingate.pipeline.gate.gate_server import SERVER_ENV, run_served


def main() -> int:
    if os.environ.get(SERVER_ENV):
        status = run_served(sys.argv[0], sys.argv[1:])
        if status is not None:
            return status
    from traingate.pipeline.gate.cli import main as run_here

    return run_here()
