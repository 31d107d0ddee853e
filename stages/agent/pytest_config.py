"""The pytest configuration file of a run pinned to the target: the file pytest itself would
read, looked for only inside the target's root (the execution stage's suite, and a test that
a stage observing training runs as its entrypoint)."""

from __future__ import annotations

import configparser
from pathlib import Path

from traingate.pipeline.model.tomlcompat import tomllib


def find_pytest_config(root: Path, tests: list[str]) -> Path | None:
    """The file pytest itself would read, looked for only inside the target root."""
    starts = [root / a.split("::", 1)[0] for a in tests if not a.startswith("-")] or [root]
    for start in starts:
        base = start if start.is_dir() else start.parent
        while True:
            for name in ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
                candidate = base / name
                if candidate.is_file() and _holds_pytest_config(candidate):
                    return candidate
            if base == root or root not in base.parents:
                break
            base = base.parent
    return None


def _holds_pytest_config(path: Path) -> bool:
    if path.name in ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini"):
        return True
    try:
        if path.name == "pyproject.toml":
            tool = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
            return isinstance(tool, dict) and "pytest" in tool
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path, encoding="utf-8")
        return parser.has_section("pytest" if path.name == "tox.ini" else "tool:pytest")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error):
        return False


def testpaths_of(path: Path) -> list[str]:
    """The `testpaths` a pytest configuration file sets; none where it sets none or cannot be read."""
    try:
        if path.name in ("pyproject.toml", "pytest.toml", ".pytest.toml"):
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            table = data.get("tool", {}).get("pytest", {}) if path.name == "pyproject.toml" else data.get("pytest", {})
            table = table.get("ini_options", table) if isinstance(table, dict) else {}
            value = table.get("testpaths", []) if isinstance(table, dict) else []
            return [str(v) for v in value] if isinstance(value, list) else [str(value)]
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path, encoding="utf-8")
        section = "tool:pytest" if path.name == "setup.cfg" else "pytest"
        return parser.get(section, "testpaths", fallback="").split() if parser.has_section(section) else []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error, AttributeError):
        return []
