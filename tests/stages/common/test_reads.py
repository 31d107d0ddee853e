"""The record of what the target's processes read (`traingate.stages.common.reads`): the audit
hook sees every way of opening a file for reading, in the process and the ones forked from it,
and a stage's record is incomplete (the gate then fails closed) when a run handed back none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traingate.stages.common.reads import FilesRead, combined, opens_for_reading

# Runs in a child: an audit hook cannot be removed, so it never goes into the test process.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from traingate.stages.common import reads
    root = sys.argv[1]
    collect = reads.install(root)
    os.chdir(root)
    open("config.yaml").read()                       # read
    open("results.json", "w").write("{}")             # only written
    with open("state.txt", "r+") as f:                # read, then rewritten in place
        f.read()
    os.close(os.open("raw.bin", os.O_RDONLY))         # os.open, read-only
    os.close(os.open("log.txt", os.O_RDWR | os.O_TRUNC))  # truncated: nothing read
    open("link.yaml").read()                          # a symlink to data/real.yaml
    open(os.path.join(os.path.dirname(root), "outside.txt")).read()
    open("/proc/self/cwd/via_proc.txt").read()          # the working folder named another way
    open(os.path.join(os.path.dirname(root), "elsewhere.link")).read()  # a link from outside into the tree
    pid = os.fork()
    if pid == 0:                                      # a forked worker (a DataLoader's)
        open("data/worker.csv").read()
        os._exit(0)
    os.waitpid(pid, 0)
    print(collect().model_dump_json())
    """
)


def test_the_hook_records_every_read_under_the_root_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "target"
    (root / "data").mkdir(parents=True)
    for name in ("config.yaml", "state.txt", "raw.bin", "log.txt", "data/real.yaml", "data/worker.csv"):
        (root / name).write_text("x\n")
    (root / "link.yaml").symlink_to(root / "data" / "real.yaml")
    (tmp_path / "outside.txt").write_text("x\n")
    (root / "via_proc.txt").write_text("x\n")
    (root / "linked.txt").write_text("x\n")
    (tmp_path / "elsewhere.link").symlink_to(root / "linked.txt")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = FilesRead.model_validate(json.loads(done.stdout))
    assert record.complete
    assert record.paths == ["config.yaml", "data/real.yaml", "data/worker.csv", "linked.txt", "raw.bin", "state.txt", "via_proc.txt"]


@pytest.mark.parametrize(
    ("mode", "flags", "reads"),
    [
        ("r", 0, True), ("rb", 0, True), ("r+", 0, True), ("a+", 0, True), ("w", 0, False), ("w+", 0, False), ("a", 0, False), ("x", 0, False),
        (None, os.O_RDONLY, True), (None, os.O_RDWR, True), (None, os.O_WRONLY, False), (None, os.O_RDWR | os.O_TRUNC, False),
    ],
)
def test_what_counts_as_opening_for_reading(mode: str | None, flags: int, reads: bool) -> None:
    assert opens_for_reading(mode, flags) is reads


def test_a_stage_record_is_incomplete_when_a_run_handed_back_none() -> None:
    whole = combined([FilesRead(paths=["b.json"]), FilesRead(paths=["a.yaml", "b.json"])])
    assert whole == FilesRead(paths=["a.yaml", "b.json"])
    assert combined([]).complete
    missing = combined([FilesRead(paths=["a.yaml"]), None])
    assert not missing.complete and missing.paths == ["a.yaml"]
    assert missing.why_incomplete == "1 of the stage's 2 run(s) handed back no record of what they read"
    partial = combined([FilesRead(paths=[], complete=False, why_incomplete="the pipe filled")])
    assert not partial.complete and partial.why_incomplete == "the pipe filled"


FILL = textwrap.dedent(
    """
    import os, sys
    from traingate.stages.common import reads
    root = sys.argv[1]
    collect = reads.install(root, pipe_bytes=4096)
    pid = os.fork()
    if pid == 0:  # a worker that reads more files than the pipe to the collector holds
        for name in sorted(os.listdir(root)):
            open(os.path.join(root, name)).close()
        os._exit(0)
    os.waitpid(pid, 0)
    print(collect().model_dump_json())
    """
)


def test_a_record_the_pipe_could_not_hold_is_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "target"
    root.mkdir()
    # A pipe of one page, a line of 251 bytes per file: 40 files overflow it.
    for n in range(40):
        (root / f"{n:0250d}").touch()
    done = subprocess.run([sys.executable, "-c", FILL, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    record = FilesRead.model_validate(json.loads(done.stdout))
    assert not record.complete and record.why_incomplete is not None and "pipe to the harness filled" in record.why_incomplete
    assert 0 < len(record.paths) < 40
