"""The README and docs/ say what the code does: their marked code blocks run, their links lead
somewhere, the generated category page is current, and the README's test command is `.ci/run`'s.

A fenced block right after `<!-- check: KIND -->` is checked here, in this process (no gate run):
`run`, each line a `traingate` command that starts no stage (it must exit 0 and print);
`config`, a target's configuration (`[tool.traingate]` of a pyproject.toml, or a traingate.toml);
`policy`, a CI policy file. The install commands at the top of the README are not run here.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.gate.policy_source import PolicyFileError, load_ci_policy
from traingate.pipeline.gate import categories_doc
from tests.conftest import REPO, cli_in_process

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- check: (\w+) -->\n(`{3,})\w*\n(.*?)^\2$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@dataclass(frozen=True)
class Block:
    page: Path
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}: {self.kind}: {self.text.splitlines()[0]}"


def marked_blocks() -> list[Block]:
    return [Block(page, m.group(1), m.group(3)) for page in PAGES for m in MARKED.finditer(page.read_text())]


def check_config(text: str) -> TargetConfig:
    """A configuration as the gate validates it (the entrypoint's files, absent here, are not looked up)."""
    data = tomllib.loads(text)
    return TargetConfig.model_validate(data["tool"]["traingate"] if "tool" in data else data)


def check_policy(text: str, tmp_path: Path) -> None:
    path = tmp_path / "traingate-policy.toml"
    path.write_text(text)
    load_ci_policy(path)


def run_commands(text: str) -> None:
    for line in (line.split("#", 1)[0].strip() for line in text.splitlines()):
        if not line:
            continue
        command = shlex.split(line)
        assert command[0] == "traingate", line
        done = cli_in_process(*command[1:])
        assert done.returncode == 0 and done.stdout.strip(), f"{line}: exit {done.returncode}\n{done.stderr}"


@pytest.mark.parametrize("block", marked_blocks(), ids=str)
def test_a_marked_block_works_as_written(block: Block, tmp_path: Path) -> None:
    if block.kind == "run":
        run_commands(block.text)
    elif block.kind == "config":
        check_config(block.text)
    elif block.kind == "policy":
        check_policy(block.text, tmp_path)
    else:
        raise AssertionError(f"unknown check {block.kind!r} in {block.page}")


def test_the_readme_marks_its_commands_and_its_configuration() -> None:
    kinds = [block.kind for block in marked_blocks() if block.page.name == "README.md"]
    assert "run" in kinds and "config" in kinds
    assert sum(block.kind == "config" for block in marked_blocks()) >= 5


def test_the_checks_can_fail(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        check_config('[tool.traingate]\ntimeout = 600\n')  # an unknown key
    with pytest.raises(ValidationError):
        check_config('tests = []\n')
    with pytest.raises(PolicyFileError):
        check_policy('block_on = ["severe"]\n', tmp_path)
    with pytest.raises(AssertionError):
        run_commands("traingate explain no-such-category")


def test_the_category_page_is_generated_from_the_rule_table() -> None:
    assert (REPO / "docs" / "categories.md").read_text() == categories_doc.render(), (
        "docs/categories.md is stale: python -m traingate.pipeline.gate.categories_doc docs/categories.md"
    )


def test_every_relative_link_leads_to_a_file() -> None:
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}"


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    blocks = re.findall(r"^```bash\n(.*?)\n```$", readme, re.MULTILINE | re.DOTALL)
    assert blocks[0].endswith("traingate run examples/amp-trainer --task T035 --version v7")
    # `.ci/run` runs the README's test command, step by step (pip quietly).
    ci_steps = {" ".join(line.replace(" --quiet", "").split()) for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")}
    for step in blocks[1].split(" && "):
        assert step in ci_steps, step
