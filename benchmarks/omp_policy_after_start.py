"""Whether OpenMP keeps the passive wait policy once the harness takes OMP_WAIT_POLICY out of the
target's environment (`stages/common/start_env.py`), measured on a busy machine.

    python benchmarks/omp_policy_after_start.py [--repeat 5] [--hogs 1]

Starts HOGS busy processes (other work on the runner), then, per repetition, one process per
policy, interleaved: a small MLP's training step timed over 200 steps on as many intra-op
threads as there are cores. Policies: passive as the gate starts the runs (set at torch's start,
then taken out of the environment), passive left set, none set (the runtime's default) and
active. Printed: each policy's median step time (ms) over the repetitions' medians, and its
ratio to passive left set; "passive, then taken out" should match it, "active" should not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STEPS = """
import os, statistics, sys, time
import torch
from traingate.stages.common.start_env import hide_after_start
if sys.argv[1] == "hidden":
    hide_after_start(["OMP_WAIT_POLICY"])
    assert "OMP_WAIT_POLICY" not in os.environ
torch.set_num_threads(os.cpu_count() or 1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
times = []
for step in range(220):
    started = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if step >= 20:
        times.append(time.perf_counter() - started)
print(statistics.median(times) * 1000)
"""

POLICIES = {"passive, then taken out": ("hidden", "PASSIVE"), "passive, left set": ("kept", "PASSIVE"), "none set": ("kept", None), "active": ("kept", "ACTIVE")}


def step_ms(mode: str, policy: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", STEPS, mode], env=env, capture_output=True, text=True, check=True, cwd=REPO)
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=1)
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
    try:
        found: dict[str, list[float]] = {name: [] for name in POLICIES}
        for _ in range(args.repeat):
            for name, (mode, policy) in POLICIES.items():
                found[name].append(step_ms(mode, policy))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    reference = statistics.median(found["passive, left set"])
    print(f"{os.cpu_count()} cores, {args.hogs} busy process(es), {args.repeat} interleaved repetitions; load average {os.getloadavg()[0]:.1f}")
    for name, values in found.items():
        median = statistics.median(values)
        print(f"{name:26s} median step {median:8.2f} ms  ({median / reference:5.2f}x passive left set)  runs: {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
