"""The rule table: one rule per finding category (and per sub-rule where one category holds
several protocol rules), the single source of what a finding is.

A finding is built from its rule (`traingate.pipeline.findings.finding`): the rule gives its id
(SARIF's `ruleId`), its default severity, when it blocks (`Blocks`: by the policy, never,
always), the stage that owns it, and the generic impact and fix used when a finding has
nothing more specific to say. The orchestrator's consistency check, SARIF, JUnit, `traingate
explain` and the stages' category lists read the same rules; docs/categories.md is
generated from them (`python -m traingate.reports.categories_doc`).
"""

from __future__ import annotations

from dataclasses import dataclass

from traingate.pipeline.schema import Blocks, Category, EvidenceKind, Severity, blocks_under

ANY_STAGE = "any"
DOCS = "docs/categories.md"

_BLOCKS_TEXT = {
    Blocks.POLICY: "Blocks when its severity is in `policy.block_on` (critical and high by default).",
    Blocks.NEVER: "Never blocks.",
    Blocks.ALWAYS: "Always blocks: the gate fails closed on what it could not check.",
}


@dataclass(frozen=True)
class Rule:
    category: Category
    stage: str  # the stage that owns it, or "any"
    severity: Severity  # the default severity; a finding may be milder or graver with its evidence
    description: str  # one line, the report contract's wording (a sub-rule: the finding's title)
    check: str  # what the check does (a sub-rule: what happened)
    measure: str  # how it measures or observes
    blocks: Blocks  # when a finding of this rule blocks
    impact: str  # the generic impact, used when a finding has nothing more specific
    fix: str  # the generic fix, used when a finding has nothing more specific
    note: str = ""  # more on when it blocks (a severity the policy or the evidence changes)
    sub: str = ""  # the sub-rule's name within its category; "" for the category's own rule
    doc: str = DOCS

    @property
    def id(self) -> str:
        """Stable: the category, or `category/sub-rule`."""
        return f"{self.category.value}/{self.sub}" if self.sub else self.category.value

    @property
    def blocks_text(self) -> str:
        if self.blocks is Blocks.ALWAYS and self.note:
            return f"Always blocks: {self.note}"
        return " ".join(t for t in (_BLOCKS_TEXT[self.blocks], self.note) if t)

    def blocking(self, severity: Severity, evidence: EvidenceKind, block_on: frozenset[Severity] | set[Severity]) -> bool:
        return blocks_under(self.blocks, severity, evidence, block_on)


RULES: tuple[Rule, ...] = (
    Rule(
        Category.TEST_FAILURE, "execution", Severity.HIGH,
        "a test failed or errored",
        "Runs the repo's pytest suite (the `tests` arguments) in a child process and records every test's outcome.",
        "Each test's report from a pytest plugin inside the run; a run that ends before every collected test ran is a failure too.",
        Blocks.POLICY,
        "A failing test means the behaviour it checks is broken in this version (or the test is).",
        "Run the failing test locally with `python -m pytest TEST_ID` and fix the code or the test it points at.",
    ),
    Rule(
        Category.COLLECTION_ERROR, "execution", Severity.HIGH,
        "the suite could not be imported or collected",
        "Collects the pytest suite and records every module or conftest that fails to import "
        "(a test module whose own import of a package that is not installed fails is a `test-environment` instead).",
        "The collection reports of the pytest run, located at the innermost frame of the target's code.",
        Blocks.POLICY,
        "The tests in this module never run, so whatever they check is unverified.",
        "Fix the error at the location shown so the module imports in a clean environment (missing dependency, wrong import path, code that needs a GPU or network at import).",
    ),
    Rule(
        Category.NO_TESTS, "execution", Severity.HIGH,
        "no test ran (none collected, or all deselected or skipped)",
        "Counts the tests that actually ran in the pytest run.",
        "The test reports of the pytest run; none collected, all deselected, all skipped or a run that ended before any test counts as none.",
        Blocks.POLICY,
        "A suite that runs nothing verifies nothing; passing it would be a false pass.",
        "Make sure the paths in `tests` hold tests pytest collects and that nothing ends or empties the run.",
    ),
    Rule(
        Category.SKIPPED_TESTS, "execution", Severity.LOW,
        "tests were skipped; the reasons, grouped",
        "Groups the skipped tests of the pytest run by their skip reason.",
        "The test reports of the pytest run.",
        Blocks.POLICY,
        'Skipped tests verify nothing here; a defect in what they cover would pass unnoticed.',
        'Run them where their condition holds (for example a CUDA runner), or remove the skip if it no longer applies.',
        note='Low severity by default, so it does not block under the default policy.',
    ),
    Rule(
        Category.TEST_SELECTION, "execution", Severity.MEDIUM,
        "the run was narrowed: an option or hook took tests out, or a test file is outside the suite",
        "Records the selection options in effect in the pytest run (`-k`, `-m`, `--deselect`, `--ignore*`, `-x`/`--maxfail`, "
        "`--lf`/`--ff`, `-p no:...`) and where each came from (`addopts` of the target's pytest configuration, its `tests` "
        "arguments, or a conftest that set it); every deselection and who made it; tests a hook dropped from the collected list "
        "without deselecting them; paths `--ignore`, `collect_ignore` or a hook kept out of collection; and test files in the "
        "repository the suite never reached.",
        "The gate's pytest plugin, from inside the run: the options as pytest parsed them, the caller of `pytest_deselected`, "
        "the collected list before and after `pytest_collection_modifyitems`, the result of `pytest_ignore_collect`; a scan "
        "of the tree for `test_*.py` / `*_test.py`.",
        Blocks.POLICY,
        'Tests left out of the run verify nothing; a failing test taken out this way turns a red suite green.',
        'Let the gate run the whole suite: remove the option or hook, or pin the suite from the CI with `tests` in the policy file.',
        note='Medium (an option) or low (a file outside the suite) by default: seen, not blocking by itself. Against a `--baseline`, a test that passed there and was taken out here is a blocking `test-disabled`; an option under which pytest runs no test (`--collect-only`, `--setup-plan`) is a blocking `stage-error`.',
    ),
    Rule(
        Category.TEST_DISABLED, "execution", Severity.HIGH,
        "a test that passed in the baseline is skipped, xfailed, deselected, not collected or gone",
        "With `--baseline`, compares this run's per-test records with the baseline's by node id; a test whose node id "
        "changed is followed by the hash of its function's body (moved or renamed).",
        "The per-test records of both runs (`stages[].tests` in report.json): outcome, and for a test taken out, how and "
        "where (the marker, the hook, the option and the file that sets it, or \"deleted\").",
        Blocks.POLICY,
        "Taking a failing test out of the run is the commonest way a red suite is made green.",
        "Restore the test and fix what makes it fail; if the removal is intended, waive the finding with a reason.",
    ),
    Rule(
        Category.TEST_WEAKENED, "execution", Severity.HIGH,
        "a test that passed in the baseline fails on this version in its baseline form (the change edited the test it breaks)",
        "With a `--baseline` whose report records its commit, runs every test that passed there and whose test code this "
        "version changed (its file, the conftest files and pytest configuration above it, the helper modules of its test "
        "folder) in its baseline form: those files as the baseline commit has them, laid over this version's code in a "
        "temporary folder, in a pytest child isolated and budgeted like the suite.",
        "The outcome of each replayed test as the gate's pytest plugin observed it; an assertion (any exception other than "
        "an interface change) or a skip is the test's verdict on this version. The finding carries the diff of the test's "
        "source from the baseline to this version and the baseline form's failure.",
        Blocks.POLICY,
        "The change rewrote the test it breaks: the suite is green only because the test no longer checks what it did.",
        "Restore the test and fix the code it fails on; if the change of behaviour is intended, accept the finding with a waiver that says why.",
        note="An interface change (`test-weakened/interface-changed`) and a replay that could not be done (`test-weakened/not-replayed`) are medium: seen, not blocking by default. See docs/edited-tests.md.",
    ),
    Rule(
        Category.TEST_WEAKENED, "execution", Severity.MEDIUM,
        "the baseline's form no longer runs here; its new form passes",
        "The baseline's form of a changed test stopped at a TypeError, ImportError, AttributeError or NameError on this "
        "version (or is no longer collected): the code's interface changed and the test was updated with it.",
        "The exception type of the replayed test's failure or of its module's collection error.",
        Blocks.POLICY,
        "Whether the behaviour the test checks is unchanged is not verified by the baseline's form; only its new form ran.",
        "Read the diff of the test: if only the call changed, nothing to do; `interface_changes_block = true` in the policy makes these block.",
        note="Medium by default; `interface_changes_block = true` in the policy makes it high.",
        sub="interface-changed",
    ),
    Rule(
        Category.TEST_WEAKENED, "execution", Severity.MEDIUM,
        "baseline tests not replayed",
        "Tests that passed in the baseline changed in this version, but their baseline form could not be read: the baseline "
        "report records no commit, or the commit is not in this clone (a shallow checkout).",
        "`git cat-file -e <commit>` in the target's checkout; the per-test source hashes of both reports name the tests.",
        Blocks.POLICY,
        "Whether the change weakened the tests it edited was not checked.",
        "Fetch the history the baseline needs (actions/checkout `fetch-depth: 0`), and keep the baseline report of a committed version.",
        sub="not-replayed",
    ),
    Rule(
        Category.TEST_ENVIRONMENT, "execution", Severity.LOW,
        "a test or a test module could not run here: it needs the network or a package that is not installed",
        "Reads the exception of every failing test (and the exceptions it was raised from) as the pytest plugin recorded it, "
        "and the import error of every test module that fails to collect.",
        "A network error while resolving or connecting (socket.gaierror, ConnectionError, urllib's URLError, requests' ConnectionError, "
        "an OSError from a socket call), or an ImportError of a module that is neither installed nor part of the target's tree. "
        "A test module counts when the failing import (or network access) is its own, at its top; the same failure inside the "
        "target's code that the module imports stays a `collection-error`, since the code under test cannot load. "
        "An assertion is always the test's own verdict: it stays a `test-failure`.",
        Blocks.POLICY,
        'What these tests check was not verified in this run; the suite was incomplete.',
        'Mark the tests (for example `@pytest.mark.network`) and deselect them in `tests` (`-m "not network"`), or install the missing package in the CI environment. A test module that imports it at its top can skip without it (`pytest.importorskip("package")` in place of the import) or be left out with `--ignore=PATH` in `tests`.',
        note="Low severity by default, so it does not block; `test_environment_blocks = true` in the policy makes it high. The stage's summary says how many tests could not run. pytest runs no test at all when a test module cannot be imported, so if nothing else ran, `no-tests` blocks as well: nothing was verified.",
    ),
    Rule(
        Category.ENTRYPOINT_CRASH, "execution", Severity.CRITICAL,
        "the smoke call of the entrypoint raised or died; located at the innermost frame in the target's own code",
        "Calls the configured entrypoint once, seeded, in a fresh child process: a function or a method with its setup and kwargs, or a script run as `__main__` with its args (after its setup, when it has one).",
        "The exception and traceback the harness records, or the stack dumped when the process died.",
        Blocks.POLICY,
        "Training crashes as soon as anyone runs it; the tests passing does not mean the training function works.",
        "Fix the line this points at (read the traceback), and add a test that calls the entrypoint on tiny inputs so the suite catches it next time.",
    ),
    Rule(
        Category.ENTRYPOINT_UNTESTED, "execution", Severity.MEDIUM,
        "the test suite never executes the entrypoint",
        "Runs the suite under coverage of the entrypoint's file.",
        "The statements of the code the entrypoint reaches (a function's or method's body; a script's module-level code, `__main__` block and function bodies) that the tests execute.",
        Blocks.POLICY,
        "A defect in the training function itself (a KeyError on its first lines, a wrong argument) passes the test suite.",
        "Add a test that calls the entrypoint on tiny inputs (a few steps, a tiny model) and checks its result.",
    ),
    Rule(
        Category.DEPRECATED_API, "execution", Severity.LOW,
        "a deprecated PyTorch API is used",
        "Records PyTorch's deprecation warnings raised in the suite and the smoke call.",
        "The warnings observed while the code ran, located at the target's line that triggered them.",
        Blocks.NEVER,
        'The call works with this PyTorch and breaks when a later release removes the old API.',
        'Switch to the API the PyTorch deprecation notice recommends.',
    ),
    Rule(
        Category.MEMORY_LEAK, "performance", Severity.HIGH,
        "memory held between training steps grows with the number of steps",
        "Runs the entrypoint instrumented and samples, between optimizer steps, the live tensor memory, the process's host memory "
        "and the steps whose autograd nodes each named tensor's graph holds.",
        "A robust slope (Theil-Sen) and trend test (Mann-Kendall) over the steps after warm-up, on tensor bytes and on host memory, "
        "and graphs holding more steps at each check; with the holder and the line that stores into it.",
        Blocks.POLICY,
        "A long run keeps every step's tensors until it runs out of memory; what fits for a few hundred steps fails hours in.",
        "Keep Python numbers or detached values instead of tensors: `losses.append(loss.item())` once per logging interval, "
        "or `loss.detach()` accumulated on the device; bound caches (collections.deque(maxlen=...)) and clear per-epoch lists.",
    ),
    Rule(
        Category.HOST_SYNC, "performance", Severity.MEDIUM,
        "the training step synchronises host and device (explicit or implicit), per call site",
        "Runs the entrypoint instrumented and counts host-device synchronisations inside optimizer steps.",
        "Every sync (`.item()`, `.cpu()`, `synchronize`, data-dependent branches) counted per call site in the target's code, per step.",
        Blocks.POLICY,
        "Each sync stalls the host until the device has drained its queue, so the host cannot queue the next kernels "
        "ahead of time; the GPU idles between steps by the launch latency of the next step's work.",
        "Keep values on the device inside the step (accumulate `loss.detach()` into a tensor, stack per-step values) "
        "and read them back once per epoch or every N steps; replace data-dependent Python branches on tensors with tensor ops.",
    ),
    Rule(
        Category.AMP_SPEEDUP, "performance", Severity.HIGH,
        "mixed precision is slower than the policy's minimum speedup",
        "Times the training step with the AMP flag on and off, uninstrumented.",
        "Median step time of each setting after warm-up; gates on CUDA only, reported as not applicable elsewhere.",
        Blocks.POLICY,
        "The mixed-precision change does not deliver the speedup the task requires.",
        "Check where the step's time goes (the breakdown below): syncs, data waits and small kernels do not get faster in reduced precision.",
    ),
    Rule(
        Category.AMP_MEMORY, "performance", Severity.HIGH,
        "mixed precision saves less peak memory than the policy's minimum",
        "Measures peak device memory of the training run with the AMP flag on and off.",
        "torch.cuda.max_memory_allocated per setting; gates on CUDA only, reported as not applicable elsewhere.",
        Blocks.POLICY,
        "The mixed-precision change does not deliver the memory saving the task requires.",
        "Check what dominates peak memory (parameters and optimizer state stay in fp32 under autocast; activations shrink).",
    ),
    Rule(
        Category.AMP_ACCURACY, "performance", Severity.HIGH,
        "mixed precision drifts from full precision beyond the tolerance",
        "Runs the entrypoint with the AMP flag on and off, same seed.",
        "Relative difference of the final loss between the two runs, against `amp_accuracy_tolerance`.",
        Blocks.POLICY,
        "Results trained with mixed precision differ from full precision beyond what the task accepts.",
        "Keep precision-sensitive computations (losses over large values, reductions, softmax/normalisation) in float32 under autocast, or rescale the values they work on.",
    ),
    Rule(
        Category.AMP_INACTIVE, "performance", Severity.HIGH,
        "mixed precision was switched on but no reduced-precision compute happened",
        "Runs the entrypoint with the AMP flag on and counts the dtypes of the compute it dispatches.",
        "Operations dispatched in float16/bfloat16 during the AMP-on run.",
        Blocks.POLICY,
        "The run pays for mixed precision (scaler, casts) and gets none of its speed or memory savings; reported AMP results describe full precision.",
        "Run the forward pass and the loss inside `with torch.autocast(device_type, dtype=...)`, entered with the AMP flag as `enabled`.",
    ),
    Rule(
        Category.INPUT_STALL, "performance", Severity.MEDIUM,
        "the training step waits on data loading for a large share of its time",
        "Runs the entrypoint instrumented and times DataLoader iteration inside each step.",
        "Median share of the step spent waiting for the batch (host clock), with the lines sampled while waiting.",
        Blocks.POLICY,
        "The device idles while the host prepares batches: training runs at the data pipeline's speed, not the model's.",
        "Make the per-sample work cheaper (precompute, cache decoded samples, avoid I/O or sleeps in __getitem__), "
        "or overlap it with compute: num_workers > 0, persistent_workers=True, prefetch_factor, pin_memory on CUDA.",
    ),
    Rule(
        Category.PERF_REGRESSION, "performance", Severity.HIGH,
        "step time or peak memory is worse than the baseline beyond measurement noise",
        "Compares this run's step time and peak memory with the `--baseline` report's, metric by metric id.",
        "The relative change against a noise margin taken from both runs' spread.",
        Blocks.POLICY,
        "This change makes training slower or hungrier than the version it replaces.",
        "Compare the time breakdown and memory chart of both reports to find the phase or line that changed.",
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        "GradScaler used out of protocol (clip before `unscale_`, `optimizer.step` bypassing the scaler, missing `update`, double `unscale_`)",
        "Runs the entrypoint with GradScaler and optimizer calls recorded, per iteration.",
        "The observed call sequence of each iteration, checked against the scale/unscale_/step/update protocol.",
        Blocks.POLICY,
        "Gradients are clipped or applied at the wrong scale, or the scale never adapts: training silently diverges or skips steps.",
        "Follow the order scaler.scale(loss).backward(), scaler.unscale_(optimizer) before clipping, scaler.step(optimizer), scaler.update().",
    ),
    # The protocol's own rules: each GradScaler finding is built from one of these.
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'Gradients clipped while still scaled (clipping before scaler.unscale_)',
        'The gradients were clipped after a backward of a scaled loss and before `scaler.unscale_(optimizer)`, so the clipping threshold was compared with gradients multiplied by the loss scale.',
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'With scaling on (65536 by default) almost every step is clipped to the threshold, silently shrinking the updates; the model trains much slower or not at all under AMP.',
        'Call `scaler.unscale_(optimizer)` right before clipping: `scaler.scale(loss).backward(); scaler.unscale_(optimizer); clip_grad_norm_(...); scaler.step(optimizer); scaler.update()`.',
        sub='clip-before-unscale',
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'optimizer.step() called directly while a GradScaler scales the loss',
        'The optimizer stepped on gradients of a scaled loss without going through `scaler.step(optimizer)`.',
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'The update uses gradients multiplied by the loss scale and is never skipped on inf/NaN gradients, so one overflow corrupts the weights; `scaler.update()` then raises or misadjusts the scale.',
        'Replace `optimizer.step()` with `scaler.step(optimizer)` followed by `scaler.update()`.',
        sub='step-bypasses-scaler',
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'scaler.step() without scaler.update() before the next iteration',
        '`scaler.step(optimizer)` ran and the next iteration began (another `scale` or `step`) without `scaler.update()` in between.',
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'The loss scale never adapts: after an overflow every later step is skipped, and with scaling enabled the next `scaler.step` raises `step() has already been called since the last update()`.',
        'Call `scaler.update()` once per iteration, after `scaler.step(...)` for every optimizer.',
        sub='missing-update',
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'scaler.unscale_() called twice before a step',
        '`scaler.unscale_(optimizer)` ran a second time for the same optimizer before `scaler.step`/`scaler.update`.',
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'With scaling enabled this raises `unscale_() has already been called on this optimizer since the last update()`; if it did not, gradients would be divided by the scale twice.',
        'Call `scaler.unscale_(optimizer)` once per optimizer per iteration, after all gradients for that step have been accumulated.',
        sub='unscale-twice',
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'scaler.unscale_() called after scaler.step() in the same iteration',
        '`scaler.unscale_(optimizer)` ran after `scaler.step(optimizer)` and before `scaler.update()`.',
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'With scaling enabled this raises `unscale_() is being called after step()`; whatever it prepares comes too late to affect the update.',
        'Move `scaler.unscale_(optimizer)` (and any clipping) before `scaler.step(optimizer)`.',
        sub='unscale-after-step',
    ),
    Rule(
        Category.GRADSCALER_PROTOCOL, "concurrency", Severity.HIGH,
        'Optimizer step on gradients of an earlier iteration',
        "The optimizer stepped although no backward ran since its previous step and its gradients were not cleared, so it applied the previous iteration's gradients again.",
        "The recorded GradScaler and optimizer calls of each iteration, in order.",
        Blocks.POLICY,
        'Each such step repeats an old update: the training silently takes extra steps in a stale direction.',
        "Run the backward of the current batch before each step (and `zero_grad()` after it); under gradient accumulation step only after the last micro-batch's backward.",
        sub='stale-gradients',
    ),
    Rule(
        Category.NONBLOCKING_RACE, "concurrency", Severity.HIGH,
        "the result of a `non_blocking` copy is read before the copy is known to be complete",
        "Records device-to-host copies made with non_blocking=True and the first read of their result.",
        "Observed on CUDA: a read with no synchronisation in between; elsewhere read from source (static, never blocks).",
        Blocks.POLICY,
        "Reads stale or partial values at random: losses, metrics or saved tensors that differ from what the GPU computed.",
        "Synchronise before reading the copy (`torch.cuda.current_stream().synchronize()`, or record an event after the "
        "copy and call `event.synchronize()`), or drop non_blocking=True for copies that are read right away.",
    ),
    Rule(
        Category.NONDETERMINISM, "concurrency", Severity.HIGH,
        "two runs with the same seeds diverge",
        "Runs the entrypoint again with the same seeds (and another hash seed, and deterministic algorithms) and compares.",
        "The per-step losses, returned values and seeding calls of the runs; the first difference is located.",
        Blocks.POLICY,
        "Results cannot be reproduced or compared between runs: a regression and a lucky seed look the same, and a bug seen once may never show again.",
        "Seed every source of randomness the run uses (torch, numpy, random, DataLoader workers) and avoid iteration over sets or other hash-ordered containers.",
    ),
    Rule(
        Category.DATALOADER_HAZARD, "concurrency", Severity.HIGH,
        "DataLoader workers crash, hang, lose dataset state, or only work under one start method",
        "Records every DataLoader the entrypoint builds and loads a batch from each under `fork` and `spawn`.",
        "Worker failures, timeouts and pickling errors observed per loader and start method.",
        Blocks.POLICY,
        "The training run stops (or waits forever without a timeout) at this loader.",
        "Fix the dataset or collate_fn at the location shown so that its workers start and load under every start method.",
    ),
    Rule(
        Category.STREAM_RACE, "concurrency", Severity.HIGH,
        "unsynchronised access to a tensor from two CUDA streams",
        "Runs the entrypoint under the CUDA sanitizer (CUDA only).",
        "Accesses to one tensor from two streams with no synchronisation between them.",
        Blocks.POLICY,
        "The kernels can run in either order: results vary from run to run and can be silently wrong.",
        "Make the consuming stream wait for the producer (`stream.wait_stream(other)` or an event record/wait), and call `tensor.record_stream(stream)` for tensors used on a side stream.",
    ),
    Rule(
        Category.INEFFECTIVE_STEP, "correctness", Severity.HIGH,
        "an optimizer step changed none of its parameters, or a trained parameter never changed",
        "Runs the entrypoint with optimizer step hooks that fingerprint every parameter of the optimizer's groups right before and right after each `step()`; "
        "at a step that changed nothing, it states the cause it saw: gradients cleared between the last backward and the step (the clearing `zero_grad()` and the backward named), "
        "a learning rate of 0 (the scheduler named), a backward that left the parameters without a gradient (the loss does not reach them), every parameter frozen, or no backward since the previous step.",
        "Observed: each parameter's exact sum, L2 norm and sampled elements across each step (an EMA update between steps does not count); the latest backward and "
        "`zero_grad()` call, the gradients present after the backward and at the step, each group's learning rate and the parameters' requires_grad.",
        Blocks.POLICY,
        "The step costs a forward and backward pass and teaches the model nothing; the finding names the cause it observed and its fix.",
        "Fix the cause the finding names: clear the gradients before the backward (not between backward and step), start a warm-up above 0, remove the cut between the loss "
        "and the parameters, or unfreeze the parameters the optimizer should train.",
    ),
    Rule(
        Category.UNUSED_PARAMETER, "correctness", Severity.HIGH,
        "a model parameter is in no optimizer group, or is in one but never receives a gradient",
        "Records every module the entrypoint constructs and every optimizer step; compares the modules' trainable parameters with the optimizers' groups and with the gradients present at each step.",
        "Observed: a requires_grad parameter that received a gradient but is held by no optimizer, or one in a group whose `.grad` stayed None over the whole run.",
        Blocks.POLICY,
        "Part of the model is never trained: a layer created after the optimizer, a second model never registered, or a branch cut off from the loss (a dead branch, `detach()`, `torch.no_grad()` around part of the forward).",
        "Build the optimizer after the whole model and from all of its parameters, and make sure the loss depends on the parameter shown (or set requires_grad=False on it if it is meant to stay fixed).",
        note="Medium (not blocking by default) when the module holding the parameters never ran a forward: its output reaches no loss (an unused head left in the optimizer).",
    ),
    Rule(
        Category.UNUSED_PARAMETER, "correctness", Severity.HIGH,
        "The output layer is frozen: the layer whose output the loss is given has no parameter that trains",
        "A training loss (gradients recorded, other parameters training) was given the output of a layer the target's own code built, at its initialisation "
        "(no `load_state_dict` reached it), all of whose parameters have requires_grad=False.",
        "The module behind the loss's input (through views) at the first call of each loss line, its parameters' requires_grad, and the `requires_grad_(False)` call that froze it where one was seen. "
        "A layer a library built or a checkpoint loaded (a pretrained output layer frozen on purpose) and a loss whose target the same layer produced (a perceptual loss) are not judged.",
        Blocks.POLICY,
        "The output layer stays at its random initialisation: the rest of the model trains to fit a fixed random projection, and the predictions stay near chance.",
        "Leave the new output layer trainable when freezing the rest (freeze the backbone's parameters only, then set `requires_grad=True` on the head's).",
        sub="frozen-output",
    ),
    Rule(
        Category.GRAD_ACCUMULATION, "correctness", Severity.HIGH,
        "gradient accumulation over k micro-batches does not give the gradient of one batch k times as large",
        "With `accumulation_kwarg` and `batch_size_kwarg` configured: runs one update with accumulation k over micro-batches of b and one with accumulation 1 over a batch of k*b, same data and seeds.",
        "Measured: the relative difference of the gradients the first `step()` applies (norm and sampled elements), against `grad_accumulation_tolerance`.",
        Blocks.POLICY,
        "Accumulated updates are k times too large (the loss not divided by the accumulation steps) or otherwise not what a larger batch would give: changing the accumulation silently changes the effective learning rate.",
        "Divide each micro-batch's loss by the number of accumulation steps before backward (loss = loss / accumulation_steps).",
    ),
    Rule(
        Category.UNSHUFFLED_TRAINING, "correctness", Severity.MEDIUM,
        "a DataLoader that drives optimizer steps never shuffles, or its DistributedSampler repeats one order every epoch",
        "Records every DataLoader, which one handed out the batch before each optimizer step, its sampler and `DistributedSampler.set_epoch` calls.",
        "Observed: a loader that drove steps with a SequentialSampler over more than one batch, or a shuffling DistributedSampler iterated over more than one epoch without `set_epoch`.",
        Blocks.POLICY,
        'Every epoch sees the data in the same order (sorted by class or time, often): gradients are biased and the model generalises worse.',
        'Pass shuffle=True (or a shuffling sampler) to the training DataLoader, and call sampler.set_epoch(epoch) at the start of every epoch with a DistributedSampler.',
        note='Medium by default, so it does not block: add `medium` to `policy.block_on` to block on it.',
    ),
    Rule(
        Category.NO_LEARNING, "correctness", Severity.CRITICAL,
        "the loss became NaN or inf during training, or (opt-in) does not fall when training on one repeated batch",
        "Runs the entrypoint with every backward call's loss kept; with `overfit_steps` configured, once more with every DataLoader repeating its first batch, for that many optimizer steps.",
        "Observed: the first backward call whose loss (unscaled, when a GradScaler scaled it) is not finite, with its optimizer step and the line that called backward; "
        "reported when the run never recovers (its last loss or a parameter is still NaN or inf at the end), not for an overflow a GradScaler or guard skipped. "
        "On one batch: the first step's loss against the mean of the last three, against `overfit_min_reduction`.",
        Blocks.POLICY,
        "From that step on the gradients are NaN or inf and every update corrupts the weights: the run trains nothing.",
        "Find what produces the non-finite value before the step shown (log of 0, division by 0, a learning rate too high, fp16 overflow without a GradScaler).",
    ),
    Rule(
        Category.DDP_DIVERGENCE, "correctness", Severity.HIGH,
        "under torchrun, the ranks' model parameters differ after training, or every rank trained on the same batches",
        "With `[tool.traingate.distributed] nproc` configured: runs the entrypoint under torchrun (`torch.distributed` elastic launch, gloo on the CPU, NCCL on CUDA) with that many ranks, "
        "then compares what each rank reports: every parameter and buffer of the modules it built (a digest of all bytes and evenly spaced samples), before the first and after the last optimizer step, "
        "the digest of every batch its DataLoaders handed out, its `torch.manual_seed` calls and the DistributedDataParallel wrappers it built.",
        "Observed: a parameter whose bytes differ between ranks after training (the first one named, with the largest difference over the compared elements), BatchNorm running statistics that differ "
        "where nothing synchronises them, or a training DataLoader that handed every rank the same batches.",
        Blocks.POLICY,
        "Each rank trains its own model: the checkpoint rank 0 saves is one of several models that drifted apart, and a DataLoader without a DistributedSampler makes every rank compute the same gradients, "
        "so N processes do the work of one.",
        "Wrap the model in DistributedDataParallel (which broadcasts rank 0's weights and averages the gradients), seed the weights the same on every rank, use SyncBatchNorm (or DDP's broadcast_buffers) "
        "for BatchNorm, and give the training DataLoader a DistributedSampler.",
    ),
    Rule(
        Category.STALE_GRADIENTS, "correctness", Severity.HIGH,
        "an optimizer step applied gradients carried over from before its previous step: nothing cleared them in between",
        "Runs the entrypoint with every backward call and optimizer step observed: before each backward adds into `.grad`, the gradient every optimizer's parameters hold; "
        "at each step, how much of the gradient it applies was already there at that optimizer's previous step. Deliberate accumulation (k backward calls, one step, then `zero_grad`) clears "
        "before the next backward and is clean; a step with no backward since the previous one is not judged here (with a GradScaler that is `gradscaler-protocol/stale-gradients`).",
        "Observed: the L2 norm of each parameter's `.grad` before every backward call and at every step, on its own device, read when the run ends; a parameter whose gradient was never None or zero "
        "between two steps of its optimizer carries the earlier gradient into the later step. Reported: the steps affected, the norm carried over against the norm applied, and the lines of the step and of the backward call.",
        Blocks.POLICY,
        "Every step adds all earlier gradients: the update grows with the step count and keeps pushing in old directions, so the training diverges or crawls (momentum and Adam's moments compound it).",
        "Clear the gradients once per optimizer step: `optimizer.zero_grad(set_to_none=True)` right after `optimizer.step()` (or before the backward); when accumulating, after the step that ends the accumulation.",
    ),
    Rule(
        Category.TRAIN_EVAL_MODE, "correctness", Severity.HIGH,
        "optimizer steps taken with Dropout or BatchNorm in eval mode, or forward passes under no_grad with them in train mode",
        "Runs the entrypoint with a forward hook on the modules whose behaviour depends on the mode (Dropout with p > 0, MultiheadAttention with dropout, BatchNorm and the other norm layers that track running statistics) "
        "and `Module.train`/`eval` recorded: which call set each module's mode, whether gradients were recorded in each forward, and which optimizer step followed.",
        "Observed: an optimizer step training a model whose forward ran those modules in eval mode, left there by `eval()`/`train(False)` on the whole model (a part frozen on purpose, "
        "a BatchNorm's own `eval()` or a backbone's, is not counted); or a forward under `torch.no_grad()`/`torch.inference_mode()`, called from the target's own code, with them in train mode, unless "
        "its outputs fed the loss of the same step (a target, teacher or EMA network, followed from its output to the next backward: that forward is training). "
        "Located at the line that called the model; the modules and their mode are named.",
        Blocks.POLICY,
        "In eval mode the training runs without dropout and normalises with stale running statistics instead of the batch's; in train mode, validation updates BatchNorm's running statistics with "
        "validation batches (the model changes) and reports metrics with dropout on.",
        "Call `model.train()` at the start of every training epoch (or after each evaluation), and `model.eval()` before validation or inference under `torch.no_grad()`.",
    ),
    Rule(
        Category.LOSS_INPUT_MISMATCH, "correctness", Severity.HIGH,
        "a loss was given the wrong input: probabilities or log-probabilities into cross_entropy, logits into nll_loss, sigmoid outputs into BCE-with-logits, or an input and a target whose shapes broadcast",
        "Runs the entrypoint with `torch.nn.functional.cross_entropy`, `nll_loss` and `binary_cross_entropy_with_logits` wrapped (the `nn` loss modules call them): "
        "the first calls from each line of the target keep a few rows of the input, the op that produced it (its autograd node, through views) and the Softmax, LogSoftmax or Sigmoid module whose output it is.",
        "Observed on every sampled call of the line, read when the run ends: rows that are non-negative and sum to 1 (probabilities) or whose exp sums to 1 (log-probabilities) given to cross_entropy; "
        "rows whose exp sums to more than 1 (no log-probabilities do) or probabilities given to nll_loss; values all in [0, 1] given to binary_cross_entropy_with_logits. "
        "Located at the loss call, naming the layer that produced the input. Log-softmax twice gives the same loss, so it is low; values in [0, 1] with no sigmoid seen are medium; a line whose losses never recorded gradients (validation) is medium. "
        "Shapes: `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss` and the BCE family (and their `nn` modules) are checked on every call, on the tensors whatever the warnings filter says: "
        "an input and a target whose shapes differ and broadcast beyond the input's shape ((B, 1) against (B,) gives (B, B)), both shapes named.",
        Blocks.POLICY,
        "The loss squashes its input a second time: with probabilities into cross_entropy (or sigmoid outputs into BCE-with-logits) the loss barely moves and the gradients shrink, so the model learns slowly or not at all; "
        "logits into nll_loss is not a likelihood and is unbounded below, so training drives the logits up instead of learning the classes.",
        "Give cross_entropy and BCE-with-logits the raw logits (drop the final Softmax/Sigmoid from the training path, apply it only for predictions), and give nll_loss `log_softmax` outputs; "
        "give an element-wise loss an input and a target of the same shape (`pred.squeeze(-1)`, `y.view_as(pred)`).",
        note="High when observed on a training loss; low for log-softmax twice (redundant, same loss), medium when no sigmoid produced the [0, 1] values or only validation losses had them.",
    ),
    Rule(
        Category.BATCH_MIXING, "correctness", Severity.HIGH,
        "one sample's model output depends on other samples of the batch (the batch dimension is mixed up)",
        "Keeps the model and its first training batch (the first outermost call of a module with trainable parameters made with gradients recorded, the batch's size from the DataLoader); "
        "when the run ends, calls the model again on that batch in eval mode (so BatchNorm's batch statistics do not count) and takes the gradient of the first and the last sample's outputs "
        "with respect to every sample's input (from the first floating module output for token ids). Where it is not zero, two more forwards put NaN into one sample each under a `TorchFunctionMode` "
        "to find the first op whose output depends on both.",
        "Observed: a nonzero gradient of sample i's outputs with respect to sample j's input, j != i. Located at the target's line that called the first op mixing the samples, "
        "naming an op before it that spread each sample over several indexes of the batch's dimension (`x.view(T, B, F)` where `transpose` was meant). "
        "Medium when no DataLoader said how many samples the batch has (dim 0 taken), or an output has two dimensions of the batch's size (pairwise scores by design); "
        "a forward with no tensor batch or no dimension of the batch's size is reported as not applicable in the stage's details.",
        Blocks.POLICY,
        "Each sample's prediction is computed from other samples: the model learns from data it should not see together, its outputs change with the batch it is in, and it does not work with a batch of one.",
        "Find the op shown: reorder dimensions with `transpose`/`permute` (not `view`/`reshape`), give reductions the right `dim`, and pass `batch_first=True` (or transpose) to RNNs and attention.",
        note="High when a DataLoader identified the batch's dimension; medium when dim 0 was assumed or an output is pairwise across the batch.",
    ),
    # -- clipping that clips nothing; evaluation samples that were trained on (docs/correctness.md) --
    Rule(
        Category.GRADIENT_CLIPPING, "correctness", Severity.HIGH,
        "gradient clipping ran before the backward whose gradients the step applies, so what is applied was never clipped",
        "Wraps `clip_grad_norm_` and `clip_grad_value_` and the backward calls; at each optimizer step over the clipped parameters, checks whether a backward ran after the latest clip of each line.",
        "Observed: a clip that ran before the backward of the coming step (after `zero_grad()`, on cleared or old gradients), or whose clipped gradients a later backward added to before the step. "
        "Located at the clip, naming the backward it should follow. Clipping before `GradScaler.unscale_` is the concurrency stage's `gradscaler-protocol`.",
        Blocks.POLICY,
        "The gradients the optimizer applies are never clipped: a loss spike or an exploding gradient goes through at full size, which the clipping was there to prevent.",
        "Clip after the last backward of the step and right before `optimizer.step()` (with a GradScaler, after `scaler.unscale_(optimizer)`).",
    ),
    Rule(
        Category.DATA_LEAKAGE, "correctness", Severity.HIGH,
        "samples fed to evaluation were also fed to training steps: the evaluation score is optimistic",
        "Fingerprints every sample of every batch the DataLoaders hand out (its first tensor's sampled elements); when the run ends, compares the samples of each loader that drove "
        "optimizer steps with those of each loader that drove none (an evaluation loader).",
        "Observed: the share of an evaluation loader's distinct samples that a training loader also handed out, with the two loaders' lines. "
        "A pass over the training data on purpose (a train-accuracy pass: a loader over the same dataset object as the training loader, or the training loader itself) is not judged; "
        "a loader whose first epoch handed out one content twice (data with repeated samples) is not compared; an overlap below 5% of the evaluated samples (or of a single sample) is taken for duplicates in the data.",
        Blocks.POLICY,
        "The model is evaluated on data it was trained on: validation loss and accuracy are optimistic, early stopping and model selection are misled.",
        "Split the data once (one `random_split` call, or one permutation of indexes, with a fixed generator) and build the training and evaluation sets from that one split.",
    ),
    Rule(
        Category.TRAINING_REGRESSION, "correctness", Severity.HIGH,
        "a training fact that held in the baseline's run fails in this one (the loss stopped falling, the learning rate collapsed, a weight matrix became symmetric, "
        "a module stopped changing, fewer samples per epoch, a loss given the wrong kind of input, evaluation outputs that differ for the same input)",
        "With `--baseline`, compares the training facts the instrumented run records (the loss of each step, each optimizer group's learning rate, gradient norm and "
        "relative parameter change at each step, each top-level module's change over the run, the distinct rows of each weight matrix at the end, the samples the "
        "training loaders handed out per epoch, the kind, shape and dtype of each classification loss's input, and whether a model run twice under no_grad on "
        "the same input gave the same output) with the baseline report's.",
        "Measured, both numbers stated. The loss (mean of the first tenth of the steps against the last tenth's): the baseline's fell by at least 20% and this run's by less than a quarter as much "
        "(a working change that learns slower, with half the steps or a 2.5 times lower learning rate, keeps more). "
        "A module held by an optimizer in both runs changed by less than 1% of its baseline change over the run. "
        "Samples per epoch: fewer than half the baseline's (another batch size keeps them). "
        "A loss's input: the kind the loss expects in the baseline, one it does not now (cross_entropy given probabilities, nll_loss given logits). "
        "Evaluation: every check gave the same output twice in the baseline and one does not now. "
        "The learning rate: a group's last-step lr over its first-step lr is more than 100 times smaller than the baseline's (another base lr or optimizer keeps the ratio). "
        "Symmetry: a weight matrix of the same name had at least half its rows distinct in the baseline and now has a share of distinct rows below 90% of the baseline's (a wider layer keeps its rows distinct). "
        "A loss that stopped falling is stated in the nearer fact's finding where there is one, and a regression a named rule of this run found (loss-input-mismatch, unused-parameter) is that rule's finding alone (one finding per cause). A fact that differs but is not worse is listed in the stage's details as changed, not worse; without a baseline nothing is compared.",
        Blocks.POLICY,
        "The change runs and passes its tests but trains worse than the version it replaces: the model it produces is worse.",
        "Look at the located line (the scheduler's step(), the initialisation call) or the change around the data and the loss; an intended change is taken as the next baseline once reviewed.",
    ),
    Rule(
        Category.HANG, ANY_STAGE, Severity.CRITICAL,
        "a run did not finish within its budget; the stacks of every thread in the evidence",
        "Runs every child process (and every stage) under a wall-clock budget.",
        "Past the budget, the stacks of every thread are dumped and the process group is killed.",
        Blocks.POLICY,
        "A training job that hangs holds its machine until someone kills it; in CI it never reports.",
        "Find what the main thread waits for in the stacks below (a lock, an event, a queue, a worker) and make sure it is always released or give the wait a timeout.",
    ),
    Rule(
        Category.STAGE_ERROR, ANY_STAGE, Severity.CRITICAL,
        "a stage itself failed; the gate fails closed",
        "Validates what each stage hands back and whether it observed what it must (a test, an optimizer step).",
        "The stage's exit, its result file and its consistency with the policy.",
        Blocks.ALWAYS,
        "The gate cannot vouch for this version, so it blocks (fail closed).",
        "Read the traceback below; if it is a defect of traingate, report it with this report.json.",
    ),
    Rule(
        Category.CONFIG_ERROR, ANY_STAGE, Severity.CRITICAL,
        "the target's configuration is invalid",
        "Reads `[tool.traingate]` of pyproject.toml or traingate.toml and validates every key.",
        "Unknown keys, wrong types and entrypoints that do not resolve, named with the file and key.",
        Blocks.ALWAYS,
        "traingate cannot run this target as configured, so nothing was checked.",
        "Correct the key named in the finding (see traingate's docs/configuration.md).",
    ),
    Rule(
        Category.LEFTOVER_PROCESS, ANY_STAGE, Severity.HIGH,
        "a test or the entrypoint left a process running after it ended; the gate killed it",
        "Looks for processes started by a test or the entrypoint that are still alive after it returned.",
        "The processes left in the child's process group or session when it ended, before the gate kills them.",
        Blocks.POLICY,
        "Processes left behind hold memory, devices and ports after the run, and in CI they can outlive the job or keep writing files.",
        "Stop what you start: join or terminate subprocesses and worker pools, shut DataLoader iterators down, and do it in a finally block or fixture teardown.",
    ),
    Rule(
        Category.TARGET_MODIFIED, ANY_STAGE, Severity.CRITICAL,
        "the code under review changed its own tracked files while it was being checked",
        "Runs each stage on a fresh copy of the target taken at the start, and compares the copy's source files before and after the stage; the user's own files are never run from, so they stay unchanged. "
        "It blocks on a file a later run or the gate reads, decided by observation: Python code and binaries, the configuration pytest and traingate parse, the requirements files the gate reads (root `requirements*.txt`, `requirements/*.txt`), "
        "anything under a path `tests` or the entrypoint names, and every file the stage's runs of target code opened for reading (a config it reads and rewrites); "
        "other tracked files the training only wrote are `target-modified/result-files`, reported once and never blocking. Without a complete record of the reads, every rewritten file blocks.",
        "Content hashes of the source files (in a git repo: tracked, or untracked and not ignored; else every file); new files are fine. "
        "The reads: an audit hook on `open` in the pytest and entrypoint children (and the processes forked from them), handed back with each run's result.",
        Blocks.ALWAYS,
        'What was checked is no longer the code under review, and the next run starts from different files.',
        'Write outputs (checkpoints, logs, caches) to a temporary folder or an ignored path, never over tracked files.',
        note='a version that rewrites itself while it is checked has not been checked.',
    ),
    Rule(
        Category.TARGET_MODIFIED, ANY_STAGE, Severity.LOW,
        "Training writes into tracked files the gate neither runs nor reads",
        "Of the tracked files a stage's run rewrote or deleted, those that are not Python code or binaries, not configuration that "
        "pytest or traingate parse (pyproject.toml, traingate.toml, pytest.ini, setup.cfg, tox.ini) or requirements files it reads, not under a path `tests` or the "
        "entrypoint names, and that no run of the stage opened for reading: results the training only wrote (a reproducibility snapshot, "
        "a `pip freeze` dump, a table, a log), whatever their names.",
        "Content hashes of the stage's copy against the pristine copy; reported once per run, by the first stage that saw each file.",
        Blocks.NEVER,
        'Running the training changes files under version control: every run leaves the working tree dirty, and a result committed by mistake hides the one it replaced.',
        'Write results to an ignored path or a folder given by a parameter (and add it to .gitignore), or leave the line be if the snapshot is meant to be committed.',
        sub='result-files',
    ),
    Rule(
        Category.ENVIRONMENT, ANY_STAGE, Severity.HIGH,
        "the target's code imports packages this environment lacks; nothing that needs them could be verified",
        "Classifies a run of the entrypoint (or an import of the target's code while pytest collects) that failed with an import "
        "of a module neither installed nor part of the target's tree; then reads every import of the target's Python files and "
        "lists each top-level module that is neither in the standard library, nor the target's own, nor installed, with the "
        "requirements files (requirements*.txt) and pyproject.toml dependencies that declare it. A test module's own import of "
        "a missing package stays a `test-environment`.",
        "The exception the harness recorded (ModuleNotFoundError), checked again by the gate with `importlib.util.find_spec` in "
        "the interpreter the target runs in; the imports read with `ast` (those under `try: ... except ImportError` and "
        "`if TYPE_CHECKING:` are optional and left out). Reported once per run.",
        Blocks.ALWAYS,
        "The code under review did not run: none of its tests or training checks could be verified in this environment.",
        "Install the missing packages in the environment the gate runs in (the finding gives the `pip install` line for all of them), "
        "and declare any the project does not declare yet in its requirements or pyproject.toml.",
        note="nothing that needs the missing packages was verified, so the gate cannot vouch for this version.",
    ),
)

_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
_BY_CATEGORY: dict[Category, Rule] = {rule.category: rule for rule in RULES if not rule.sub}


def rule_for(category: Category) -> Rule:
    """The category's own rule."""
    return _BY_CATEGORY[category]


def rule_by_id(rule_id: str) -> Rule | None:
    """A rule by its id (`memory-leak`, `gradscaler-protocol/missing-update`), or None."""
    return _BY_ID.get(rule_id)


def sub_rules(category: Category) -> tuple[Rule, ...]:
    return tuple(rule for rule in RULES if rule.category is category and rule.sub)


def categories_of(stage: str) -> frozenset[Category]:
    """The categories a stage owns, as the table says."""
    return frozenset(rule.category for rule in RULES if rule.stage == stage)


ANY_STAGE_CATEGORIES = categories_of(ANY_STAGE)


def explain(rule: Rule) -> str:
    """The text `traingate explain RULE` prints."""
    subs = sub_rules(rule.category) if not rule.sub else ()
    return "\n".join(
        [
            f"{rule.id} ({rule.stage} stage, usually {rule.severity.value})",
            "",
            f"{rule.description[0].upper()}{rule.description[1:]}" + ("" if rule.description.endswith(".") else "."),
            "",
            f"What it checks: {rule.check}",
            f"How it measures: {rule.measure}",
            f"What blocks: {rule.blocks_text}",
            f"Impact: {rule.impact}",
            f"How to fix: {rule.fix}",
            *([f"Sub-rules: {', '.join(r.id for r in subs)}"] if subs else []),
            f"More: {rule.doc}",
        ]
    )
