"""The execution stage's rules: the suite's outcomes, what a change did to its own tests, the entrypoint's smoke call.

Ids, severities and texts are the report's contract (docs/categories.md is generated from them).
"""

from __future__ import annotations

from traingate.stages.api import Blocks, Category, Rule, Severity
# Declared where every stage can import it: the other stages report it too.
from traingate.stages.shared_categories import ENTRYPOINT_CRASH as ENTRYPOINT_CRASH

STAGE = "execution"

# The stage's categories (`traingate explain CATEGORY`); a finding's category is one of these objects.
TEST_FAILURE = Category("test-failure")
COLLECTION_ERROR = Category("collection-error")
NO_TESTS = Category("no-tests")
SKIPPED_TESTS = Category("skipped-tests")
TEST_SELECTION = Category("test-selection")
TEST_DISABLED = Category("test-disabled")
TEST_WEAKENED = Category("test-weakened")
TEST_ENVIRONMENT = Category("test-environment")
ENTRYPOINT_UNTESTED = Category("entrypoint-untested")
DEPRECATED_API = Category("deprecated-api")

RULES: tuple[Rule, ...] = (
    Rule(
        category=TEST_FAILURE, stage=STAGE, severity=Severity.HIGH,
        description="a test failed or errored",
        check="Runs the repo's pytest suite (the `tests` arguments) in a child process and records every test's outcome.",
        measure="Each test's report from a pytest plugin inside the run; a run that ends before every collected test ran is a failure too.",
        blocks=Blocks.POLICY,
        impact="A failing test means the behaviour it checks is broken in this version (or the test is).",
        fix="Run the failing test locally with `python -m pytest TEST_ID` and fix the code or the test it points at.",
    ),
    Rule(
        category=COLLECTION_ERROR, stage=STAGE, severity=Severity.HIGH,
        description="the suite could not be imported or collected",
        check="Collects the pytest suite and records every module or conftest that fails to import "
        "(a test module whose own import of a package that is not installed fails is a `test-environment` instead).",
        measure="The collection reports of the pytest run, located at the innermost frame of the target's code.",
        blocks=Blocks.POLICY,
        impact="The tests in this module never run, so whatever they check is unverified.",
        fix="Fix the error at the location shown so the module imports in a clean environment (missing dependency, wrong import path, code that needs a GPU or network at import).",
    ),
    Rule(
        category=NO_TESTS, stage=STAGE, severity=Severity.HIGH,
        description="no test ran (none collected, or all deselected or skipped)",
        check="Counts the tests that actually ran in the pytest run.",
        measure="The test reports of the pytest run; none collected, all deselected, all skipped or a run that ended before any test counts as none.",
        blocks=Blocks.POLICY,
        impact="A suite that runs nothing verifies nothing; passing it would be a false pass.",
        fix="Make sure the paths in `tests` hold tests pytest collects and that nothing ends or empties the run.",
    ),
    Rule(
        category=SKIPPED_TESTS, stage=STAGE, severity=Severity.LOW,
        description="tests were skipped; the reasons, grouped",
        check="Groups the skipped tests of the pytest run by their skip reason.",
        measure="The test reports of the pytest run.",
        blocks=Blocks.POLICY,
        impact='Skipped tests verify nothing here; a defect in what they cover would pass unnoticed.',
        fix='Run them where their condition holds (for example a CUDA runner), or remove the skip if it no longer applies.',
        note='Low severity by default, so it does not block under the default policy.',
    ),
    Rule(
        category=TEST_SELECTION, stage=STAGE, severity=Severity.MEDIUM,
        description="the run was narrowed: an option or hook took tests out, or a test file is outside the suite",
        check="Records the selection options in effect in the pytest run (`-k`, `-m`, `--deselect`, `--ignore*`, `-x`/`--maxfail`, "
        "`--lf`/`--ff`, `-p no:...`) and where each came from (`addopts` of the target's pytest configuration, its `tests` "
        "arguments, or a conftest that set it); every deselection and who made it; tests a hook dropped from the collected list "
        "without deselecting them; paths `--ignore`, `collect_ignore` or a hook kept out of collection; and test files in the "
        "repository the suite never reached.",
        measure="The gate's pytest plugin, from inside the run: the options as pytest parsed them, the caller of `pytest_deselected`, "
        "the collected list before and after `pytest_collection_modifyitems`, the result of `pytest_ignore_collect`; a scan "
        "of the tree for `test_*.py` / `*_test.py`.",
        blocks=Blocks.POLICY,
        impact='Tests left out of the run verify nothing; a failing test taken out this way turns a red suite green.',
        fix='Let the gate run the whole suite: remove the option or hook, or pin the suite from the CI with `tests` in the policy file.',
        note='Medium (an option) or low (a file outside the suite) by default: seen, not blocking by itself. Against a `--baseline`, a test that passed there and was taken out here is a blocking `test-disabled`; an option under which pytest runs no test (`--collect-only`, `--setup-plan`) is a blocking `stage-error`.',
    ),
    Rule(
        category=TEST_DISABLED, stage=STAGE, severity=Severity.HIGH,
        description="a test that passed in the baseline is skipped, xfailed, deselected, not collected or gone",
        check="With `--baseline`, compares this run's per-test records with the baseline's by node id; a test whose node id "
        "changed is followed by the hash of its function's body (moved or renamed).",
        measure="The per-test records of both runs (`stages[].tests` in report.json): outcome, and for a test taken out, how and "
        "where (the marker, the hook, the option and the file that sets it, or \"deleted\").",
        blocks=Blocks.POLICY,
        impact="Taking a failing test out of the run is the commonest way a red suite is made green.",
        fix="Restore the test and fix what makes it fail; if the removal is intended, waive the finding with a reason.",
    ),
    Rule(
        category=TEST_WEAKENED, stage=STAGE, severity=Severity.HIGH,
        description="a test that passed in the baseline fails on this version in its baseline form (the change edited the test it breaks)",
        check="With a `--baseline` whose report records its commit, runs every test that passed there and whose test code this "
        "version changed (its file, the conftest files and pytest configuration above it, the helper modules of its test "
        "folder) in its baseline form: those files as the baseline commit has them, laid over this version's code in a "
        "temporary folder, in a pytest child isolated and budgeted like the suite.",
        measure="The outcome of each replayed test as the gate's pytest plugin observed it; an assertion (any exception other than "
        "an interface change) or a skip is the test's verdict on this version. The finding carries the diff of the test's "
        "source from the baseline to this version and the baseline form's failure.",
        blocks=Blocks.POLICY,
        impact="The change rewrote the test it breaks: the suite is green only because the test no longer checks what it did.",
        fix="Restore the test and fix the code it fails on; if the change of behaviour is intended, accept the finding with a waiver that says why.",
        note="An interface change (`test-weakened/interface-changed`) and a replay that could not be done (`test-weakened/not-replayed`) are medium: seen, not blocking by default. See docs/edited-tests.md.",
    ),
    Rule(
        category=TEST_WEAKENED, stage=STAGE, severity=Severity.MEDIUM,
        description="the baseline's form no longer runs here; its new form passes",
        check="The baseline's form of a changed test stopped at a TypeError, ImportError, AttributeError or NameError on this "
        "version (or is no longer collected): the code's interface changed and the test was updated with it.",
        measure="The exception type of the replayed test's failure or of its module's collection error.",
        blocks=Blocks.POLICY,
        impact="Whether the behaviour the test checks is unchanged is not verified by the baseline's form; only its new form ran.",
        fix="Read the diff of the test: if only the call changed, nothing to do; `interface_changes_block = true` in the policy makes these block.",
        note="Medium by default; `interface_changes_block = true` in the policy makes it high.",
        sub="interface-changed",
    ),
    Rule(
        category=TEST_WEAKENED, stage=STAGE, severity=Severity.MEDIUM,
        description="baseline tests not replayed",
        check="Tests that passed in the baseline changed in this version, but their baseline form could not be read: the baseline "
        "report records no commit, or the commit is not in this clone (a shallow checkout).",
        measure="`git cat-file -e <commit>` in the target's checkout; the per-test source hashes of both reports name the tests.",
        blocks=Blocks.POLICY,
        impact="Whether the change weakened the tests it edited was not checked.",
        fix="Fetch the history the baseline needs (actions/checkout `fetch-depth: 0`), and keep the baseline report of a committed version.",
        sub="not-replayed",
    ),
    Rule(
        category=TEST_ENVIRONMENT, stage=STAGE, severity=Severity.LOW,
        description="a test or a test module could not run here: it needs the network or a package that is not installed",
        check="Reads the exception of every failing test (and the exceptions it was raised from) as the pytest plugin recorded it, "
        "and the import error of every test module that fails to collect.",
        measure="A network error while resolving or connecting (socket.gaierror, ConnectionError, urllib's URLError, requests' ConnectionError, "
        "an OSError from a socket call), or an ImportError of a module that is neither installed nor part of the target's tree. "
        "A test module counts when the failing import (or network access) is its own, at its top; the same failure inside the "
        "target's code that the module imports stays a `collection-error`, since the code under test cannot load. "
        "An assertion is always the test's own verdict: it stays a `test-failure`.",
        blocks=Blocks.POLICY,
        impact='What these tests check was not verified in this run; the suite was incomplete.',
        fix='Mark the tests (for example `@pytest.mark.network`) and deselect them in `tests` (`-m "not network"`), or install the missing package in the CI environment. A test module that imports it at its top can skip without it (`pytest.importorskip("package")` in place of the import) or be left out with `--ignore=PATH` in `tests`.',
        note="Low severity by default, so it does not block; `test_environment_blocks = true` in the policy makes it high. The stage's summary says how many tests could not run. pytest runs no test at all when a test module cannot be imported, so if nothing else ran, `no-tests` blocks as well: nothing was verified.",
    ),
    Rule(
        category=ENTRYPOINT_CRASH, stage=STAGE, severity=Severity.CRITICAL,
        description="the smoke call of the entrypoint raised or died; located at the innermost frame in the target's own code",
        check="Calls the configured entrypoint once, seeded, in a fresh child process: a function or a method with its setup and kwargs, or a script run as `__main__` with its args (after its setup, when it has one).",
        measure="The exception and traceback the harness records, or the stack dumped when the process died.",
        blocks=Blocks.POLICY,
        impact="Training crashes as soon as anyone runs it; the tests passing does not mean the training function works.",
        fix="Fix the line this points at (read the traceback), and add a test that calls the entrypoint on tiny inputs so the suite catches it next time.",
        reported_by_any_stage=True,  # every stage runs the training function: a crash there is the target's
    ),
    Rule(
        category=ENTRYPOINT_UNTESTED, stage=STAGE, severity=Severity.MEDIUM,
        description="the test suite never executes the entrypoint",
        check="Runs the suite under coverage of the entrypoint's file.",
        measure="The statements of the code the entrypoint reaches (a function's or method's body; a script's module-level code, `__main__` block and function bodies) that the tests execute.",
        blocks=Blocks.POLICY,
        impact="A defect in the training function itself (a KeyError on its first lines, a wrong argument) passes the test suite.",
        fix="Add a test that calls the entrypoint on tiny inputs (a few steps, a tiny model) and checks its result.",
    ),
    Rule(
        category=DEPRECATED_API, stage=STAGE, severity=Severity.LOW,
        description="a deprecated PyTorch API is used",
        check="Records PyTorch's deprecation warnings raised in the suite and the smoke call.",
        measure="The warnings observed while the code ran, located at the target's line that triggered them.",
        blocks=Blocks.NEVER,
        impact='The call works with this PyTorch and breaks when a later release removes the old API.',
        fix='Switch to the API the PyTorch deprecation notice recommends.',
    ),
)
CATEGORIES: frozenset[Category] = frozenset(rule.category for rule in RULES)
