"""Write one version of the bundled example target to a folder.

    python examples/materialize.py VERSION DEST
    python examples/materialize.py --update-patch VERSION EDITED_TREE

examples/amp-trainer is version v7; every other version is stored as a unified diff
against it in examples/amp-trainer-versions/VERSION.patch and applied with `git apply`
in the copy. `--update-patch` rewrites a version's patch from an edited copy, which is how
a variant is changed: materialize it, edit it, update its patch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
BASE = EXAMPLES / "amp-trainer"
PATCHES = EXAMPLES / "amp-trainer-versions"
BASE_VERSION = "v7"
VERSIONS = {
    "v7": "the DataLoader refactor; test_fine_tuning still reads env['train_data'] (KeyError)",
    "v7-fixed": "v7 with the KeyError fixed and a test that calls the entrypoint",
    "v6": "before the DataLoader refactor: manual batching, per-step .item(), per-sample syncs",
}
_IGNORED = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc", ".coverage*")


class VersionError(Exception):
    """An unknown version, an unusable destination, or a patch that does not apply."""


def _git_env(cwd: Path) -> dict[str, str]:
    """Keep git from treating an enclosing repository as the one the patch belongs to."""
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent)}


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        known = ", ".join(VERSIONS)
        raise VersionError(f"unknown version {version!r}; known versions: {known}")


def patch_path(version: str) -> Path:
    return PATCHES / f"{version}.patch"


def materialize(version: str, dest: Path) -> Path:
    """Copy the base tree to `dest` (absent or empty) and apply the version's patch."""
    _check_version(version)
    dest = dest.resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise VersionError(f"destination {dest} exists and is not an empty folder")
    shutil.copytree(BASE, dest, ignore=_IGNORED, dirs_exist_ok=True)
    if version == BASE_VERSION:
        return dest
    patch = patch_path(version)
    if not patch.is_file():
        raise VersionError(f"no patch for {version}: {patch} is missing")
    done = subprocess.run(
        ["git", "apply", "--verbose", str(patch)], cwd=dest, env=_git_env(dest), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise VersionError(f"{patch.name} does not apply to {BASE.name}:\n{done.stderr.strip()}")
    return dest


def update_patch(version: str, edited: Path) -> Path:
    """Rewrite the version's patch as the difference between the base tree and `edited`."""
    _check_version(version)
    if version == BASE_VERSION:
        raise VersionError(f"{BASE_VERSION} is the base tree itself; edit {BASE} directly")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        shutil.copytree(BASE, root / "a", ignore=_IGNORED)
        shutil.copytree(edited, root / "b", ignore=_IGNORED)
        done = subprocess.run(
            ["git", "diff", "--no-index", "--no-prefix", "a", "b"],
            cwd=root, env=_git_env(root), capture_output=True, text=True,
        )
    if done.returncode not in (0, 1):
        raise VersionError(f"git diff failed:\n{done.stderr.strip()}")
    patch = patch_path(version)
    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_text(done.stdout)
    return patch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update-patch", action="store_true", help="rewrite VERSION's patch from the tree at DEST")
    parser.add_argument("version", metavar="VERSION", help=f"one of: {', '.join(VERSIONS)}")
    parser.add_argument("dest", metavar="DEST", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.update_patch:
            print(f"wrote {update_patch(args.version, args.dest)}")
        else:
            dest = materialize(args.version, args.dest)
            print(f"{args.version} ({VERSIONS[args.version]}) -> {dest}")
    except VersionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
