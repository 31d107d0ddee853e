"""The gate's own process never imports torch: it asks a child interpreter for torch's version
and CUDA (or reads the version from torch's package metadata where no GPU device node exists), so torch's warnings (its "Failed to initialize NumPy" where numpy is not installed,
as after the README's first command) never reach the gate's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TARGETS, TRAINGATE
from traingate.pipeline.gate import torch_probe
from traingate.pipeline.gate.cli import UsageError, resolve_device

NUMPY_WARNING = "Failed to initialize NumPy"


def _environment_without_numpy(folder: Path) -> dict[str, str]:
    """This environment with numpy hidden: a `numpy` package first on the path that cannot be
    imported, as torch finds it where numpy is not installed (the .venv has it, for the tests)."""
    shadow = folder / "numpy"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "TRAINGATE_POLICY")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.slow
def test_a_run_without_numpy_prints_no_numpy_warning(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    env = _environment_without_numpy(tmp_path / "no_numpy")
    torch_alone = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=120)
    if NUMPY_WARNING not in torch_alone.stderr:
        pytest.skip(f"this torch ({torch.__version__}) does not warn without numpy: nothing to keep out")
    out = tmp_path / "out"
    done = subprocess.run(
        [*TRAINGATE, "run", str(TARGETS / "exec_no_suite"), "--stages", "execution", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert NUMPY_WARNING not in done.stderr and NUMPY_WARNING not in done.stdout
    # The agents' host caught its import's warning and served nothing; the stage started no
    # interpreter of its own only to catch the same.
    assert sorted(p.parent.name for p in (out / "work").glob("*/warm-*.stderr")) == ["agents"]
    # What the gate's process asked of torch is still there, from the child interpreter.
    environment = json.loads((out / "report.json").read_text())["environment"]
    assert environment["torch"] == str(torch.__version__)
    assert environment["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_torch_facts_come_from_a_child_interpreter() -> None:
    torch = pytest.importorskip("torch")
    torch_probe.ask_torch.cache_clear()
    facts = torch_probe.ask_torch()
    assert facts.version == str(torch.__version__) and facts.problem is None
    assert facts.cuda is torch.cuda.is_available()


def test_without_a_gpu_device_node_torch_is_not_imported_and_answers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform != "linux" or any(os.path.exists(node) for node in torch_probe.GPU_DEVICE_NODES):
        pytest.skip("a GPU may be reachable here: torch is asked")
    torch = pytest.importorskip("torch")
    torch_probe.torch_facts.cache_clear()

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a child interpreter was started to ask torch")

    monkeypatch.setattr(torch_probe.subprocess, "run", no_child)
    try:
        facts = torch_probe.torch_facts()
    finally:
        torch_probe.torch_facts.cache_clear()
    assert facts == torch_probe.TorchFacts(str(torch.__version__), False, None)
    assert not torch.cuda.is_available()


def test_a_gpu_device_node_or_a_torch_not_found_asks_the_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(torch_probe, "GPU_DEVICE_NODES", (str(node),))
    assert torch_probe.facts_without_gpu() is None
    monkeypatch.setattr(torch_probe, "GPU_DEVICE_NODES", (str(tmp_path / "absent"),))
    monkeypatch.setattr(torch_probe.importlib.machinery.PathFinder, "find_spec", classmethod(lambda cls, name, path=None, target=None: None))
    assert torch_probe.facts_without_gpu() is None


def test_a_torch_that_cannot_be_imported_is_said_and_cuda_is_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_probe, "_PROBE", "import sys; sys.exit('ImportError: no torch in this environment')")
    monkeypatch.setattr(torch_probe, "facts_without_gpu", lambda: None)  # as where a GPU may be reachable
    torch_probe.torch_facts.cache_clear()
    torch_probe.ask_torch.cache_clear()
    try:
        facts = torch_probe.torch_facts()
        assert (facts.version, facts.cuda) == (None, False)
        assert facts.problem == "torch could not be imported: ImportError: no torch in this environment"
        assert resolve_device("auto") == "cpu"
        with pytest.raises(UsageError, match=r"no CUDA device is available here \(torch could not be imported: ImportError"):
            resolve_device("cuda")
    finally:
        torch_probe.torch_facts.cache_clear()
        torch_probe.ask_torch.cache_clear()


def test_device_cpu_does_not_ask_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("torch was asked for --device cpu")

    monkeypatch.setattr("traingate.pipeline.gate.cli.torch_facts", refuse)
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize(
    ("printed", "cuda", "name"),
    [
        ('{"version": "2.13.0", "cuda": true, "cuda_device_name": "GPU 0"}', True, "GPU 0"),
        ('{"version": "2.13.0", "cuda": "yes", "cuda_device_name": null}', None, None),  # not a bool: not an answer
        ('{"cuda": true}', None, None),
    ],
)
def test_the_probe_answer_is_read_through_its_model(monkeypatch: pytest.MonkeyPatch, printed: str, cuda: bool | None, name: str | None) -> None:
    monkeypatch.setattr(torch_probe, "_PROBE", f"print({printed!r})")
    torch_probe.ask_torch.cache_clear()
    try:
        facts = torch_probe.ask_torch()
    finally:
        torch_probe.ask_torch.cache_clear()
    if cuda is None:
        assert (facts.version, facts.cuda) == (None, False) and facts.problem == f"torch's answer could not be read: {printed!r}"
    else:
        assert (facts.version, facts.cuda, facts.cuda_device_name, facts.problem) == ("2.13.0", cuda, name, None)
