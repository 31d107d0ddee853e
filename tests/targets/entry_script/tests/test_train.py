import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "train.py"


def test_the_script_trains_and_exits_normally(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--steps", "3"])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert ended.value.code == 0
    assert "mean loss" in capsys.readouterr().out
