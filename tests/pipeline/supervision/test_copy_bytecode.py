"""The run's copy of the child side takes the installed bytecode (renamed to the copy, never
naming the install) instead of compiling its modules at every gate run, and compiles afresh
what is not current; `traingate run` does not import the initializer."""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType

import pytest

from tests.paths import REPO
from traingate.pipeline.supervision import disguise
from traingate.pipeline.supervision.disguise import Disguise, DisguiseError, compile_copy


@pytest.fixture(scope="module")
def mask() -> Iterator[Disguise]:
    built = disguise.build()
    try:
        yield built
    finally:
        disguise.remove(built)


def file_names(code: CodeType) -> set[str]:
    names = {code.co_filename}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= file_names(const)
    return names


def test_every_copied_module_has_current_bytecode_naming_the_copy_only(mask: Disguise) -> None:
    copy = Path(mask.folder) / mask.package
    sources = sorted(copy.rglob("*.py"))
    assert len(sources) > 20
    for source in sources:
        data = Path(importlib.util.cache_from_source(str(source))).read_bytes()
        stat = source.stat()
        assert data[:4] == importlib.util.MAGIC_NUMBER, source
        assert int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF, source
        assert int.from_bytes(data[12:16], "little") == stat.st_size, source
        assert file_names(marshal.loads(data[16:])) == {str(source)}, source
        assert str(REPO).encode() not in data, source


def test_a_child_loads_the_copy_from_its_bytecode(mask: Disguise) -> None:
    """The target's environment writes no bytecode: the copy's must be the one read."""
    code = f"import sys; sys.path.insert(0, {mask.folder!r}); import {mask.package}.harness.entrypoint"
    done = subprocess.run([sys.executable, "-v", "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=True)
    cached = importlib.util.cache_from_source(str(Path(mask.folder, mask.package, "harness", "entrypoint.py")))
    assert f"# code object from '{cached}'" in done.stderr.splitlines()
    assert not [line for line in done.stderr.splitlines() if mask.folder in line and ("stale" in line or "bad" in line)]


def installed_like(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """A folder standing for `stages` with one module compiled in place, and a copy of it."""
    stages, copy = tmp_path / "stages", tmp_path / "copy"
    stages.mkdir()
    (stages / "mod.py").write_text(text)
    py_compile.compile(str(stages / "mod.py"), doraise=True)
    copy.mkdir()
    return stages, copy


def test_bytecode_older_than_the_copied_file_is_compiled_afresh(tmp_path: Path) -> None:
    stages, copy = installed_like(tmp_path, "VALUE = 1\n")
    (copy / "mod.py").write_text("VALUE = 22\n")  # not what the installed bytecode was made from
    compile_copy(copy, stages)
    namespace: dict[str, object] = {}
    exec(marshal.loads(Path(importlib.util.cache_from_source(str(copy / "mod.py"))).read_bytes()[16:]), namespace)
    assert namespace["VALUE"] == 22


def test_a_copied_module_that_does_not_compile_fails_the_copy(tmp_path: Path) -> None:
    stages, copy = installed_like(tmp_path, "VALUE = 1\n")
    (copy / "mod.py").write_text("def broken(:\n")
    with pytest.raises(DisguiseError, match="do not compile"):
        compile_copy(copy, stages)


def test_the_run_command_does_not_import_the_initializer() -> None:
    code = "import sys, traingate.pipeline.gate.cli; print('traingate.pipeline.gate.initializer' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
