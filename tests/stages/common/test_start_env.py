"""The runtime variables the gate sets for target code are read by OpenMP, then hidden
(stages/common/start_env.py), without importing torch where torch's own OpenMP can be started
without it."""

from __future__ import annotations

import os
import subprocess
import sys

from traingate.stages.common import start_env

# Hides the policy, says whether torch had to be imported for it, then starts torch: OpenMP
# describes its settings (OMP_DISPLAY_ENV) each time a runtime starts.
CHILD = """
import os, sys
from traingate.stages.common.start_env import hide_after_start
hide_after_start(["OMP_WAIT_POLICY"])
print("imported torch:", "torch" in sys.modules, "policy seen:", os.environ.get("OMP_WAIT_POLICY"), flush=True)
import torch
torch.get_num_threads()
"""


def test_the_policy_is_read_by_the_one_runtime_torch_uses_then_hidden() -> None:
    env = {**os.environ, "OMP_WAIT_POLICY": "ACTIVE", "OMP_DISPLAY_ENV": "TRUE"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    bundled = start_env._bundled_gnu_openmp() is not None
    assert f"imported torch: {not bundled} policy seen: None" in done.stdout
    # One runtime started, before the variable went, and torch's libraries run on it: a runtime
    # started after would show the default policy.
    displayed = done.stdout + done.stderr
    assert displayed.count("OPENMP DISPLAY ENVIRONMENT BEGIN") == 1, displayed
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in displayed


def test_without_torch_the_variables_stay(monkeypatch) -> None:
    monkeypatch.setenv("TG_TEST_READ_AT_START", "x")
    monkeypatch.setattr(start_env, "_start_openmp", lambda: False)
    start_env.hide_after_start(["TG_TEST_READ_AT_START"])
    assert os.environ["TG_TEST_READ_AT_START"] == "x"
