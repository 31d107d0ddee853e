"""Which files are the target's (`traingate.stages.common.frames.is_target_file`): the files under
its root, less the installed packages and virtual environments a repo may hold."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from traingate.stages.common.frames import _FOREIGN_PARTS as FOREIGN, is_target_file


def by_path_objects(filename: str, root: Path) -> bool:
    """The rule as path objects state it, with no shortcut."""
    if not filename or filename.startswith("<"):
        return False
    try:
        rel = Path(os.path.abspath(filename)).relative_to(root)
    except ValueError:
        return False
    return not (FOREIGN & set(rel.parts))


def test_the_roots_files_are_the_targets_and_no_others() -> None:
    root = Path("/work/repo")
    assert is_target_file("/work/repo/train.py", root) and is_target_file("/work/repo/pkg/model.py", root)
    assert is_target_file("/work/repo/pkg/../train.py", root)
    assert not is_target_file("/work/repository/train.py", root)  # a sibling whose name starts the same
    assert not is_target_file("/work/train.py", root) and not is_target_file("<string>", root) and not is_target_file("", root)
    assert not is_target_file("/work/repo/.venv/lib/python3.11/site-packages/torch/nn/functional.py", root)
    assert is_target_file("/x.py", Path("/"))


names = st.sampled_from(["repo", "repository", "re", "pkg", "..", ".", "site-packages", ".venv", "venv", "a b", "train.py", ""])


@given(st.lists(names, max_size=5), st.lists(names.filter(lambda n: n not in ("..", ".", "")), min_size=0, max_size=3))
def test_the_text_shortcut_agrees_with_the_path_rule(parts: list[str], root_parts: list[str]) -> None:
    root = Path("/", *root_parts)
    filename = "/" + "/".join(parts)
    is_target_file.cache_clear()
    assert is_target_file(filename, root) == by_path_objects(filename, root)
