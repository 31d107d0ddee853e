"""The floors pyproject.toml declares cover what the code uses: an install that pip accepts
must be one the gate runs on."""

from __future__ import annotations

import re
import sys

from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

NEW_STYLE_WRAPPER = re.compile(r"hookimpl\([^)]*\bwrapper=True")


def _floors() -> dict[str, Version]:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for line in declared:
        requirement = Requirement(line)
        lower = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if lower:
            floors[requirement.name] = max(lower)
    return floors


def test_new_style_hook_wrappers_are_covered_by_the_declared_floors() -> None:
    """`hookimpl(wrapper=True)` is pluggy 1.2's; pytest documents it for plugins from 8.0 (with
    pluggy 1.0, allowed by `pytest>=7.4` alone, the harness failed to import)."""
    harness = sorted((REPO / "stages" / "harness").glob("*.py"))
    users = [p.name for p in harness if NEW_STYLE_WRAPPER.search(p.read_text())]
    assert users, "the harness no longer uses new-style wrappers: this test checks nothing"
    floors = _floors()
    assert floors["pluggy"] >= Version("1.2"), users
    assert floors["pytest"] >= Version("8.0"), users
