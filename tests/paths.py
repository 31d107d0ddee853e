"""Where the suite's data lies, for test modules at any depth of tests/: the fixture targets, the
schemas and samples, and the stand-in packages installed beside a target."""

from __future__ import annotations

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
TARGETS = TESTS_DIR / "targets"
SCHEMAS = TESTS_DIR / "schemas"
# A framework of Lightning's shape, and a stage of a team's own with its dist-info.
FRAMEWORK_SITE = TESTS_DIR / "framework_site"
PLUGIN_SITE = TESTS_DIR / "plugin_site"
# Folders of data, not of the suite's tests (a fixture target's own tests are the target's).
DATA_FOLDERS = frozenset({"targets", "schemas", "framework_site", "plugin_site"})


def suite_modules() -> list[Path]:
    """The suite's test modules, in tests/ and every folder under it but the data folders."""
    found = list(TESTS_DIR.glob("test_*.py"))
    for folder in TESTS_DIR.iterdir():
        if folder.is_dir() and folder.name not in DATA_FOLDERS:
            found += folder.rglob("test_*.py")
    return sorted(found)
