"""training-regression, end to end (docs/baseline-comparison.md).

tests/targets/corr_baseline_base is a clean classifier loop whose own tests pass; its report is
the baseline. Each version below is the base with one edit, run with `--baseline` on that
report: three that break training (inputs and labels shuffled with different permutations,
the scheduler's step() moved into the batch loop, every Linear weight initialised to zero)
block with a `training-regression` giving both numbers; a refactor that trains step for step
the same and a wider hidden layer pass. Held out from the first thresholds: a learning rate
1000 times lower, a huge weight decay, labels off by one sample, a loader over a quarter of
the data block; Adam instead of SGD and batches twice as large pass; an optimizer over the
wrong module and probabilities given to cross_entropy block with their named rule's finding
alone. The base is committed in git, so the loss's finding is located at the edited line.
One gate run per version, shared by its assertions.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of, run_gate

pytestmark = pytest.mark.slow

BASE = TARGETS / "corr_baseline_base"
SHUFFLE = "    order = torch.randperm(len(inputs))\n    loader = DataLoader(TensorDataset(inputs[order], labels[order]), batch_size=batch_size)\n"
EDITS: dict[str, list[tuple[str, str]]] = {
    "shuffled-apart": [(SHUFFLE, SHUFFLE.replace("labels[order]", "labels[torch.randperm(len(labels))]"))],
    "scheduler-per-batch": [
        ("            total += loss.item()\n        scheduler.step()\n", "            total += loss.item()\n            scheduler.step()\n"),
    ],
    "zero-init": [
        (
            "    return nn.Sequential(nn.Linear(10, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 4))\n",
            "    model = nn.Sequential(nn.Linear(10, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 4))\n"
            "    for layer in (model[0], model[2]):\n"
            "        nn.init.zeros_(layer.weight)  # a deterministic start\n"
            "    return model\n",
        )
    ],
    "refactor": [
        ("            loss = nn.functional.cross_entropy(model(x), y)\n", "            loss = compute_loss(model, x, y)\n"),
        ("def train(", "def compute_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:\n    return nn.functional.cross_entropy(model(x), y)\n\n\ndef train("),
    ],
    "wider": [("HIDDEN = 32\n", "HIDDEN = 64\n")],
    # Held out: other ways to break training, other intended changes.
    "lr-1000x-lower": [("LR = 0.5\n", "LR = 0.0005\n")],
    "huge-weight-decay": [("lr=LR)", "lr=LR, weight_decay=1.0)")],
    "labels-off-by-one": [(SHUFFLE, SHUFFLE.replace("labels[order]", "labels.roll(1)[order]"))],
    "part-of-the-data": [(SHUFFLE, SHUFFLE.replace("inputs[order], labels[order]", "inputs[order][:96], labels[order][:96]"))],
    "wrong-module": [("torch.optim.SGD(model.parameters()", "torch.optim.SGD(model[2].parameters()")],
    "probabilities": [("cross_entropy(model(x), y)", "cross_entropy(model(x).softmax(dim=1), y)")],
    "adam": [("torch.optim.SGD(model.parameters(), lr=LR)", "torch.optim.Adam(model.parameters(), lr=0.01)")],
    "batch-64": [("batch_size: int = 32", "batch_size: int = 64")],
}


def _repository(root: Path) -> Path:
    """The base committed in a git repository: the baseline report records the commit, and each
    version (a copy with its history) differs from it by its edit."""
    target = root / "base"
    shutil.copytree(BASE, target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(target), *args], check=True, capture_output=True)
    return target


def _version(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(root / "base", target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    text = (target / "train.py").read_text()
    for old, new in EDITS[name]:
        assert old in text, (name, old)
        text = text.replace(old, new)
    (target / "train.py").write_text(text)
    return target


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GateRun]:
    root = tmp_path_factory.mktemp("baseline")
    base = run_gate(_repository(root), root / "out-base", "--stages", "correctness")
    assert base.returncode == 0, base.stdout + base.stderr
    assert base.report["target"]["commit"]
    baseline = root / "out-base" / "report.json"
    found = {"base": base}
    for name in EDITS:
        found[name] = run_gate(_version(root, name), root / f"out-{name}", "--stages", "correctness", "--baseline", str(baseline))
    return found


def _correctness(run: GateRun) -> dict:
    return next(s for s in run.report["stages"] if s["name"] == "correctness")


def _regressions(run: GateRun) -> list[dict]:
    return [f for f in _correctness(run)["findings"] if f["category"] == "training-regression"]


def test_the_base_records_its_training_facts_and_compares_nothing(runs: dict[str, GateRun]) -> None:
    checks = _correctness(runs["base"])["details"]["checks"]
    facts = checks["training_facts"]
    assert facts["steps"] == 36 and len(facts["losses"]) == 36 and len(facts["records"]) == 36
    assert facts["records"][0]["lrs"] == [0.5] and facts["records"][-1]["lrs"] == [0.125]
    assert all(r["changes"][0] > 0 and r["grad_norms"][0] > 0 for r in facts["records"])
    assert {m["name"]: m["distinct"] for m in facts["matrices"]} == {"0.weight": 32, "2.weight": 4}
    assert [m["module"] for m in facts["modules"]] == ["0", "2"]
    assert facts["samples_per_epoch"] == 384
    assert facts["loss_inputs"] == [{"function": "cross_entropy", "kind": "logits", "shape": [32, 4], "dtype": "float32"}]
    assert "evaluation" not in facts  # nothing ran under no_grad
    assert "baseline" not in checks and not _regressions(runs["base"])


@pytest.mark.parametrize(
    ("version", "statement", "line"),
    [
        ("shuffled-apart", r"the training loss fell \d+% over 36 steps in the baseline and (?:fell|rose) \d+% over 36 now", "loader = DataLoader("),
        ("scheduler-per-batch", r"the learning rate at the last step was 0\.125 in the baseline and [0-9.e-]+ now \(changed after step 1 of 36\)", "scheduler.step()"),
        ("zero-init", r"`0\.weight` had 32 distinct rows of 32 in the baseline and (1?[0-9]|2[0-8]) of 32 now", "nn.init.zeros_(layer.weight)"),
    ],
)
def test_a_version_that_trains_worse_blocks_with_both_numbers(runs: dict[str, GateRun], version: str, statement: str, line: str | None) -> None:
    run = runs[version]
    assert run.report["decision"] == "BLOCK", run.stdout
    found = [f for f in _regressions(run) if re.search(statement, f["title"], re.IGNORECASE)]
    assert found, [f["title"] for f in _regressions(run)]
    assert found[0]["severity"] == "high" and found[0]["blocking"] is True
    assert len(_regressions(run)) == 1  # one per cause: the loss's fall is stated in the nearer fact's finding
    assert "the training loss fell" in found[0]["problem"]
    if line is not None:
        location = found[0]["location"]
        assert location["path"] == "train.py" and location["line"] == line_of(run.out.parent / version / "train.py", line)


@pytest.mark.parametrize(
    ("version", "statement", "line"),
    [
        ("lr-1000x-lower", r"module `0` changed by 0\.\d+ over the run in the baseline and by [0-9.e-]+ now; module `2` changed by", "LR = 0.0005"),
        ("huge-weight-decay", r"the training loss fell 58% over 36 steps in the baseline and (?:fell|rose) \d% over 36 now", "weight_decay=1.0"),
        ("labels-off-by-one", r"the training loss fell 58% over 36 steps in the baseline and (?:fell|rose) \d% over 36 now", "loader = DataLoader("),
        ("part-of-the-data", r"the training data loaders handed out 384 samples per epoch in the baseline and 96 now", "loader = DataLoader("),
    ],
)
def test_held_out_ways_to_break_training_block_with_both_numbers(runs: dict[str, GateRun], version: str, statement: str, line: str) -> None:
    run = runs[version]
    assert run.report["decision"] == "BLOCK", run.stdout
    [found] = _regressions(run)  # one per cause
    assert re.search(statement, found["title"], re.IGNORECASE), found["title"]
    assert found["severity"] == "high" and found["blocking"] is True
    location = found["location"]  # the line the change touched: in the run's lines where it ran one
    assert location["path"] == "train.py" and location["line"] == line_of(run.out.parent / version / "train.py", line)


@pytest.mark.parametrize(
    ("version", "category", "statement"),
    [
        ("wrong-module", "unused-parameter", r"module `0` changed by 0\.\d+ over the run in the baseline and is held by no optimizer now \(stated in the unused-parameter finding\)"),
        (
            "probabilities", "loss-input-mismatch",
            re.escape("`cross_entropy` was given logits of shape [32, 4] (float32) in the baseline and probabilities of shape [32, 4] (float32) now (stated in the loss-input-mismatch finding)"),
        ),
    ],
)
def test_a_regression_a_named_rule_finds_is_that_rules_finding_alone(runs: dict[str, GateRun], version: str, category: str, statement: str) -> None:
    run = runs[version]
    assert run.report["decision"] == "BLOCK"
    assert [f["category"] for f in _correctness(run)["findings"] if f["blocking"]] == [category]
    regressions = _correctness(run)["details"]["checks"]["baseline"]["regressions"]
    assert any(re.fullmatch(statement, r) for r in regressions), regressions


@pytest.mark.parametrize("version", ["refactor", "wider", "adam", "batch-64"])
def test_an_intended_change_passes(runs: dict[str, GateRun], version: str) -> None:
    run = runs[version]
    check = _correctness(run)["details"]["checks"]["baseline"]
    assert check["ran"] is True and check["regressions"] == [] and not _regressions(run)
    assert "loss fall" in check["compared"]
    assert run.report["decision"] == "PASS", [f["title"] for s in run.report["stages"] for f in s["findings"]]


def test_a_wider_layer_is_changed_not_worse(runs: dict[str, GateRun]) -> None:
    check = _correctness(runs["wider"])["details"]["checks"]["baseline"]
    assert any("`0.weight` had 32 distinct rows of 32 in the baseline and 64 of 64 now" in c for c in check["changed_not_worse"])



def test_the_page_draws_both_loss_curves_and_states_the_regression(runs: dict[str, GateRun]) -> None:
    page = (runs["shuffled-apart"].out / "correctness.md").read_text()
    chart = page.split("```mermaid", 1)[1].split("```", 1)[0]
    now, then = (list(map(float, values.split(", "))) for values in re.findall(r"^\s+line \[(.*)\]$", chart, re.M))
    # The baseline's curve falls well below where it started; this version's stays near its start.
    assert then[-1] < then[0] * 0.6 and now[-1] > now[0] * 0.8
    assert "## Against the baseline" in page and "- ⛔ " in page
    base_page = (runs["base"].out / "correctness.md").read_text()
    assert len(re.findall(r"^\s+line \[", base_page, re.M)) == 1 and "## Against the baseline" not in base_page
