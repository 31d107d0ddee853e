"""The test run's launcher leaves out what costs time and reports nothing: hypothesis's terminal
summary where no test imported hypothesis (`UnusedHypothesisSummary`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

# A pytest run with the launcher's plugin, hypothesis's plugin loaded from its entry point as in
# any run where hypothesis is installed; it prints what its process imported by the end.
RUN = textwrap.dedent(
    """
    import json, sys
    import pytest
    from traingate.stages.execution.probe.pytest_launcher import UnusedHypothesisSummary

    code = pytest.main([sys.argv[1], "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[UnusedHypothesisSummary()])
    print(json.dumps({"code": int(code), "hypothesis": "hypothesis" in sys.modules}))
    """
)


def _run(tmp_path: Path, test: str, *args: str) -> tuple[dict[str, object], str]:
    (tmp_path / "test_one.py").write_text(textwrap.dedent(test))
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    *output, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join(output)


def test_a_run_whose_tests_never_import_hypothesis_never_imports_it(tmp_path: Path) -> None:
    facts, output = _run(tmp_path, "def test_plain():\n    assert 1 + 1 == 2\n")
    assert facts == {"code": 0, "hypothesis": False}
    assert "1 passed" in output


def test_a_run_whose_tests_use_hypothesis_keeps_its_summary(tmp_path: Path) -> None:
    test = """
        from hypothesis import given, strategies as st

        @given(st.integers())
        def test_sum(x):
            assert x + 0 == x
    """
    facts, output = _run(tmp_path, test, "--hypothesis-show-statistics")
    assert facts == {"code": 0, "hypothesis": True}
    assert "Hypothesis Statistics" in output and "1 passed" in output
