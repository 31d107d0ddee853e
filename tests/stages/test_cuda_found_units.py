"""What a run on a GPU showed, kept on a CPU: each test here fails on the code before the fix.

- DataLoader workers forked under the concurrency stage's CUDA watches raised "Cannot
  re-initialize CUDA in forked subprocess" (CSAN asks for the stream on every operator): the
  watches' dispatch modes pass operators straight through in a forked child.
- A run that failed (its loader's worker raised) was compared step by step with a rerun that
  trained: "loss no step vs 230036.0" read as nondeterminism. A failed run's missing steps are
  its outcome, and a failed instrumented run is not compared at all.
- `.to("cpu", non_blocking=True)` into pinned memory was counted as a host-device sync.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import EntrypointRun
from traingate.stages.concurrency.determinism import RunData, compare
from traingate.stages.concurrency.probe.cuda import passing_through_in_forked_children
from traingate.stages.concurrency.probe.payloads import RngPayload
from traingate.stages.performance.probe.syncs import _non_blocking

torch = pytest.importorskip("torch")


@pytest.mark.skipif(sys.platform != "linux", reason="os.fork with a dispatch mode on the stack: Linux")
def test_a_watch_mode_passes_operators_through_in_a_forked_child() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class RefusingMode(TorchDispatchMode):
        """Stands for CSAN's mode in a forked child: it raises on every operator."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    passing_through_in_forked_children(RefusingMode)
    passing_through_in_forked_children(RefusingMode)  # twice: wrapped once
    a = torch.ones(3)
    read, write = os.pipe()
    with RefusingMode():
        with pytest.raises(RuntimeError, match="forked subprocess"):
            a + 1  # in the process that installed it, the mode still runs
        pid = os.fork()
        if pid == 0:  # the forked child: the operator runs as if no mode were there
            try:
                os.write(write, str(float((a + 1).sum())).encode())
            finally:
                os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 64).decode() == "6.0"
    os.close(read)


def run(label: str, losses: list[list[Any]], ok: bool) -> RunData:
    child = ChildResult(argv=[], returncode=0, timed_out=False, duration_s=1.0, stdout="", stderr="")
    exception = None if ok else {"type": "RuntimeError", "message": "Caught RuntimeError in DataLoader worker process 0.", "traceback": "", "frames": [], "target_frame": None}
    result = {"ok": ok, "phase": "call", "returned": {"loss": 1.0} if ok else None, "exception": exception, "duration_s": 1.0}
    return RunData(label, "0", EntrypointRun(child=child, result=result), losses, RngPayload.model_validate({"records": [], "target_modules": []}))


def test_a_failed_run_diverges_in_its_outcome_not_in_a_step_it_never_made() -> None:
    crashed, trained = run("run 1", [], ok=False), run("run 3", [[230036.0], [1.0]], ok=True)
    divergence = compare(crashed, trained)
    assert divergence is not None and divergence.where == "outcome"
    assert "no step" not in divergence.describe() and "DataLoader worker" in divergence.describe()
    # Steps both made are still compared first; a failure after matching steps says so.
    partly = compare(run("run 1", [[230036.0]], ok=False), trained)
    assert partly is not None and partly.where == "outcome" and "after 1 optimizer step(s) that matched" in partly.describe()
    # Two runs that both returned and made different numbers of steps still differ at a step.
    shorter = compare(run("a", [[230036.0]], ok=True), trained)
    assert shorter is not None and (shorter.where, shorter.second) == ("step", [1.0])


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("cpu",), {"non_blocking": True}, True),
        (("cpu",), {}, False),
        (("cpu", torch.float32, True), {}, True),
        ((torch.float16, False), {}, False),
        (("cpu",), {"non_blocking": False, "copy": True}, False),
    ],
)
def test_non_blocking_is_read_by_keyword_or_position(args: tuple[Any, ...], kwargs: dict[str, Any], expected: bool) -> None:
    assert _non_blocking(args, kwargs) is expected
