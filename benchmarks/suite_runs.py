"""What the test suite's `traingate` processes cost, and which of them could be one.

    TRAINGATE_SUITE_RUNS=/tmp/runs.jsonl python -m pytest -n 2
    python benchmarks/suite_runs.py /tmp/runs.jsonl [--top 15]

The log (tests/conftest.py, `note_cli_run`) has one line per command a test started through
`start_cli`: gate runs, shared or a test's own, and the other commands. Printed: the number of
gate runs and of other commands with their children's CPU, the modules whose runs cost most,
the runs made more than once (the same target content and the same arguments, an --out folder
aside, a run refused before any stage left out: one shared run, `shared_gate` or `gate_once` in tests/conftest.py, could serve them),
and the fixture targets run with more than one set of stages (where one run of the union might
serve, unless an earlier stage stops the training the later ones need).

A run the worker's import server served (`shared_torch_import` in tests/conftest.py) counts only
the `traingate` caller's CPU: the gate's process is a fork of the gate server, and its host, the
agents and their runs are the import server's children. Compare CPU with
TRAINGATE_SUITE_IMPORT_SERVER=0, or wall times.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def is_gate_run(record: dict[str, Any]) -> bool:
    return bool(record["args"]) and record["args"][0] == "run"


def stages_of(record: dict[str, Any]) -> str:
    args = record["args"]
    return args[args.index("--stages") + 1] if "--stages" in args else "all"


def print_totals(records: list[dict[str, Any]]) -> None:
    runs = [r for r in records if is_gate_run(r)]
    others = [r for r in records if not is_gate_run(r)]
    for label, group in (("gate runs", runs), ("other commands", others)):
        cpu = sum(r["children_cpu_s"] for r in group)
        print(f"{label:15} {len(group):5}   children's CPU {cpu:8.1f} s   wall {sum(r['wall_s'] for r in group):8.1f} s")


def print_modules(records: list[dict[str, Any]], top: int) -> None:
    by_module: dict[str, list[float]] = defaultdict(list)
    for record in records:
        by_module[(record["test"] or "?").split("::")[0]].append(record["children_cpu_s"])
    print(f"\nmodules by the CPU of their commands (top {top}):")
    for module, cpu in sorted(by_module.items(), key=lambda item: -sum(item[1]))[:top]:
        print(f"  {sum(cpu):7.1f} s  {len(cpu):3} commands  {module}")


def print_repeats(records: list[dict[str, Any]]) -> int:
    same: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in filter(is_gate_run, records):
        if record["returncode"] != 2:  # 2: refused before a stage ran (what such a test is about)
            same[tuple(record["args"])].append(record)
    repeated = {key: group for key, group in same.items() if len(group) > 1}
    print(f"\ngate runs made more than once (same content and arguments): {sum(len(g) - 1 for g in repeated.values())} extra")
    for key, group in repeated.items():
        print(f"  {len(group)}x {group[0]['target']} {' '.join(key[2:]).replace('--out OUT', '').strip()}")
        for record in group:
            print(f"       {record['test']}  (exit {record['returncode']})")
    return len(repeated)


def print_stage_sets(records: list[dict[str, Any]]) -> None:
    sets: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for record in filter(is_gate_run, records):
        if record["target"] and not record["target"].startswith("copy:"):
            sets[record["target"]][stages_of(record)].append(record["test"])
    several = {target: found for target, found in sets.items() if len(found) > 1}
    print(f"\nfixture targets run with more than one set of stages: {len(several)}")
    for target, found in sorted(several.items()):
        print(f"  {target}: " + "; ".join(f"{stages} ({len(tests)})" for stages, tests in found.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the file TRAINGATE_SUITE_RUNS named")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    records = load(args.log)
    print_totals(records)
    print_modules(records, args.top)
    print_repeats(records)
    print_stage_sets(records)


if __name__ == "__main__":
    main()
