"""The packages a target declares it needs: its requirements files and pyproject.toml's
`[project] dependencies` and optional dependencies, and which distribution a module comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traingate.pipeline.model.tomlcompat import tomllib

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# Modules whose distribution is named otherwise (the common ones in training code).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "sklearn": ("scikit-learn",),
    "skimage": ("scikit-image",),
    "PIL": ("pillow",),
    "cv2": ("opencv-python", "opencv-python-headless", "opencv-contrib-python"),
    "yaml": ("pyyaml",),
    "bs4": ("beautifulsoup4",),
    "attr": ("attrs",),
    "dateutil": ("python-dateutil",),
    "google": ("protobuf",),
    "jwt": ("pyjwt",),
    "dotenv": ("python-dotenv",),
    "Crypto": ("pycryptodome",),
    "tensorboardX": ("tensorboardx",),
    "pytorch_lightning": ("pytorch-lightning",),
    "lightning": ("lightning",),
    "hydra": ("hydra-core",),
    "git": ("gitpython",),
    "fitz": ("pymupdf",),
}


@dataclass(frozen=True)
class Declared:
    """One declared requirement: its distribution's name, as written, and where."""

    name: str
    spec: str  # the requirement as written (version and markers included)
    source: str  # "requirements.txt", "pyproject.toml [project] dependencies", ...


def normalise(name: str) -> str:
    """PEP 503: case and runs of `-`, `_`, `.` do not distinguish distributions."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions_of(module: str) -> tuple[str, ...]:
    """The distribution names a top-level module is likely installed by, normalised."""
    return tuple(normalise(d) for d in (*DISTRIBUTIONS.get(module, ()), module))


def declared_requirements(root: Path) -> dict[str, Declared]:
    """Every declared requirement by its normalised name (the first declaration wins)."""
    found: dict[str, Declared] = {}
    for entry in [*_requirements_files(root), *_pyproject(root)]:
        found.setdefault(normalise(entry.name), entry)
    return found


def _requirements_files(root: Path) -> list[Declared]:
    files = sorted(root.glob("requirements*.txt")) + sorted((root / "requirements").glob("*.txt"))
    found = []
    for file in files:
        try:
            lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        source = file.relative_to(root).as_posix()
        for line in lines:
            text = line.split(" #", 1)[0].strip()
            match = _NAME.match(text)
            if match and not text.startswith(("-", "#")) and "://" not in text:
                found.append(Declared(name=match.group(1), spec=text, source=source))
    return found


def _pyproject(root: Path) -> list[Declared]:
    try:
        data: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    project: dict[str, Any] = data["project"] if isinstance(data.get("project"), dict) else {}
    groups: list[tuple[str, Any]] = [("pyproject.toml [project] dependencies", project.get("dependencies"))]
    optional = project.get("optional-dependencies")
    if isinstance(optional, dict):
        groups += [(f"pyproject.toml [project.optional-dependencies] {extra}", deps) for extra, deps in optional.items()]
    found = []
    for source, deps in groups:
        for dep in deps if isinstance(deps, list) else []:
            match = _NAME.match(dep) if isinstance(dep, str) else None
            if match:
                found.append(Declared(name=match.group(1), spec=dep.strip(), source=source))
    return found
