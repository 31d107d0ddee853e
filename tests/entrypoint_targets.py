"""Targets a test writes itself: their files, their smoke calls as the execution stage makes them,
and the configuration error an `[entrypoint]` table gets."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from traingate.pipeline.gate.config_file import ConfigError, load_config
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext
from traingate.stages.execution.coverage import entrypoint_source
from traingate.stages.execution.smoke import SmokeResult, smoke_calls


def make_target(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def smoke(root: Path, warm: WarmPool | None = None) -> SmokeResult:
    """The execution stage's smoke calls of the target at `root`; forked from `warm`'s
    interpreters when given (the `warm_pool` fixture), as a stage agent's runs are."""
    config, _ = load_config(root)
    ctx = StageContext(stage="execution", root=root, config=config, device="cpu", deadline=time.time() + 120, scratch=root / ".scratch", warm=warm)
    assert config.entrypoint is not None
    return smoke_calls(ctx, entrypoint_source(root, config.entrypoint))


def config_error(root: Path, entrypoint_toml: str, files: dict[str, str] | None = None) -> ConfigError:
    make_target(root, {"traingate.toml": "[entrypoint]\n" + textwrap.dedent(entrypoint_toml), **(files or {})})
    with pytest.raises(ConfigError) as raised:
        load_config(root)
    return raised.value
