"""The entrypoint harness run in a fresh interpreter, as the tests of the probes need it (the
probes patch torch for the rest of a process): `run_requests` imports torch and the harness once,
then runs each request in a fork of its own (as the warm start does), every run from the same
clean state, each result written as the harness writes it to the channel (JSON, NaN and inf as
JSON's extensions, repr for the rest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DRIVER = """
import json, os, sys
import torch, torch._dynamo
from traingate.stages.contract.messages import EntrypointRequest
from traingate.stages.harness.entrypoint import as_sent, run

for request, path in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            result = as_sent(run(EntrypointRequest.model_validate_json(request)))
            with open(path, "w", encoding="utf-8") as out:
                json.dump(result, out, default=repr)
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        sys.exit(f"the run writing {path} failed")
"""


def run_requests(root: Path, requests: list[tuple[str, str]], timeout: float = 300) -> None:
    """Each (request JSON, result path) run by the harness, in `root`; fails on a run that did."""
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(requests)], capture_output=True, text=True, timeout=timeout, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
