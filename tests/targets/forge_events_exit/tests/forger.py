"""Writes forged `passed` records for a test everywhere a test can find that might carry the
gate's events: a request file named on the command line and the events file it names, events
files near the working folder, and every descriptor of this process but stdin/stdout/stderr.
It writes only to files that look like results (never to source files)."""

import glob
import json
import os
import sys


def forged_lines(nodeid: str) -> bytes:
    lines = [{"event": "test_start", "nodeid": nodeid, "path": nodeid.split("::")[0], "line": 1}]
    lines += [{"event": "report", "nodeid": nodeid, "when": when, "outcome": "passed", "duration": 0.0} for when in ("setup", "call", "teardown")]
    lines.append({"event": "finish", "exitstatus": 0})
    # Both the bare event format and an envelope with a guessed nonce.
    text = "".join(json.dumps(line) + "\n" for line in lines)
    text += "".join(json.dumps({"nonce": "guess", "seq": i, "kind": "pytest-event", "body": line}) + "\n" for i, line in enumerate(lines))
    return text.encode()


def candidate_files() -> list[str]:
    found = []
    for arg in sys.argv:
        if arg.endswith(".json") and os.path.isfile(arg):
            try:
                events = json.loads(open(arg).read()).get("events")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(events, str):
                found.append(events)
    found += glob.glob(os.path.join(os.getcwd(), "..", "**", "*.events.jsonl"), recursive=True)
    return found


def is_regular_file(fd: int) -> bool:
    try:
        return os.path.isfile(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return False


def forge(nodeid: str, rewrite: bool) -> None:
    data = forged_lines(nodeid)
    for path in candidate_files():
        try:
            with open(path, "wb" if rewrite else "ab") as out:
                out.write(data)
        except OSError:
            pass
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in (0, 1, 2):
            continue
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if target.endswith(".py"):
            continue
        try:
            if rewrite and is_regular_file(fd):
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
            os.write(fd, data)
        except OSError:
            pass
