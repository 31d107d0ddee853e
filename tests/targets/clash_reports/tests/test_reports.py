from pathlib import Path

import reports
import tests.conftest

HERE = Path(__file__).resolve().parent


def test_summary_names_the_steps(losses):
    assert reports.summary_line("tiny", losses) == "tiny: 3 steps, final loss 0.2500"


def test_the_modules_imported_are_this_repo_own():
    assert Path(tests.conftest.__file__).resolve().parent == HERE
    assert Path(reports.__file__).resolve() == HERE.parent / "reports.py"
