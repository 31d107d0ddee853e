"""The child of the warm-start tests: a small module on PYTHONPATH that reports what it sees
(`PROBE`), run through `run_child` from a warm pool or fresh, told what to do on its stdin."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from traingate.pipeline.supervision.isolation import ChildResult, python_argv, run_child
from traingate.pipeline.supervision.warm_pool import WarmPool


PROBE = textwrap.dedent('''
    import faulthandler, json, os, signal, sys, time
    preloaded = "torch" in sys.modules
    gate_modules = sorted(m for m in sys.modules if m.split(".")[0] == "traingate")
    # As the harness's guard does: the budget's stack-dump request writes this run's stacks.
    faulthandler.register(signal.SIGUSR1, file=open(os.environ["TRAINGATE_STACKS_FILE"], "a"), all_threads=True)
    order = json.loads(sys.stdin.read())
    action = order["action"]
    if action == "exit":
        sys.exit(3)
    if action == "sleep":
        time.sleep(120)
    if action in ("daemon", "daemon-then-wait"):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)  # forked, never exec'd: shows the environment block it inherited
            os._exit(0)
        os.wait()
        if action == "daemon-then-wait":
            time.sleep(float(order["wait"]))
    if action == "kill-parent":
        os.kill(os.getppid(), 9)
        time.sleep(120)
    facts = {
        "preloaded": preloaded, "gate_modules": gate_modules, "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "ppid": os.getppid(), "cwd": os.getcwd(), "marker": os.environ.get("WARM_MARKER"),
        "name": __name__, "argv0": sys.argv[0], "order": order,
        "environ_tag": [e.split(b"=", 1)[1].decode().rstrip() for e in open("/proc/self/environ", "rb").read().split(bytes(1)) if e.startswith(b"TRAINGATE_RUN_TAG=")],
    }
    os.write(order["channel"], b"channel ok")
    print(json.dumps(facts))
    print("to stderr", file=sys.stderr)
''')


def run_probe(pool: WarmPool | None, tmp_path: Path, env: dict[str, str], action: str, budget_s: float = 60, cwd: Path | None = None, **order: object) -> ChildResult:
    return run_child(
        python_argv("warmprobe"), cwd=cwd or tmp_path, budget_s=budget_s, scratch=tmp_path / "scratch", env=env,
        name=f"probe-{action}", stdin_data=lambda fd: json.dumps({"action": action, "channel": fd, **order}).encode(), channel=True, warm=pool,
    )


def probe_facts(result: ChildResult) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
