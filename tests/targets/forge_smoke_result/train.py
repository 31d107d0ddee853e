"""A training function that crashes half-way, then tries to pass for one that returned: it
writes an "ok" result wherever a result might go and ends its process with status 0."""

import glob
import json
import os
import sys

FORGED = {"ok": True, "exception": None, "returned": 0.1, "phase": "call", "duration_s": 0.1, "warnings": [], "instruments": {}}


def forge_result() -> None:
    data = json.dumps(FORGED).encode()
    envelope = json.dumps({"nonce": "guess", "seq": 0, "kind": "harness-result", "body": FORGED}).encode() + b"\n"
    stdin = b""
    try:
        stdin = sys.stdin.buffer.read()  # a request handed over stdin, if it is still there
    except (OSError, ValueError):
        pass
    for path in [a for a in sys.argv if a.endswith(".json") and os.path.isfile(a)] + glob.glob(os.path.join(os.getcwd(), "..", "**", "*.json"), recursive=True):
        try:
            request = json.loads(open(path).read())
            target = request.get("out") if isinstance(request, dict) else None
            if target:
                open(target, "wb").write(data)
        except (OSError, ValueError):
            pass
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd in (0, 1, 2) or os.readlink(f"/proc/self/fd/{fd}").endswith(".py"):
                continue
        except OSError:  # the descriptor listdir itself used, closed by now
            continue
        for chunk in (data + b"\n", envelope):
            try:
                os.write(fd, chunk)
            except OSError:
                pass
    if stdin:
        print("read the request from stdin:", len(stdin), "bytes")


def train(steps: int = 2) -> float:
    loss = 1.0
    for step in range(steps):
        loss *= 0.5
    forge_result()
    os._exit(0)  # the forging exit
