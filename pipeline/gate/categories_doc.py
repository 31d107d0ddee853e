"""`python -m traingate.pipeline.gate.categories_doc [PATH]`: docs/categories.md, written from the rule table.

The rule table (`traingate.pipeline.model.registry.rule_table`: the gate's rules and every registered
stage's) is the one list of finding categories; this page
is generated from it so that it cannot drift (tests/test_docs.py checks the committed file is
current). Without PATH the page is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from traingate.pipeline.model.registry import rule_table
from traingate.pipeline.model.rules import ANY_STAGE, Rule

HEADER = """# Finding categories

<!-- Generated from the rule table (pipeline/model/rules.py and each stage's stages/<name>/rules.py) by
`python -m traingate.pipeline.gate.categories_doc docs/categories.md`; edit the rules, not this page. -->

Every finding has one category, owned by the stage that reports it (`any`: any stage, or the
gate itself). `traingate explain CATEGORY` prints a category's entry below, and `traingate explain`
lists them all. A category's severity is its usual one: a finding may be milder or graver with
its evidence, and whether it blocks also depends on the policy (`block_on`) and on its evidence
(a finding whose evidence is only `static` never blocks).
"""


def stage_title(stage: str) -> str:
    return "Any stage" if stage == ANY_STAGE else f"The {stage} stage"


def sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


def rule_entry(rule: Rule, heading: str) -> list[str]:
    lines = [
        f"{heading} `{rule.id}`",
        "",
        sentence(rule.description),
        "",
        f"- **Usually**: {rule.severity.value}",
        f"- **What it checks**: {rule.check}",
        f"- **How it measures**: {rule.measure}",
        f"- **What blocks**: {rule.blocks_text}",
        f"- **Impact**: {rule.impact}",
        f"- **How to fix**: {rule.fix}",
        "",
    ]
    for sub in rule_table().sub_rules(rule.category) if not rule.sub else ():
        lines += rule_entry(sub, heading + "#")
    return lines


def render() -> str:
    own_rules = [rule for rule in rule_table() if not rule.sub]
    stages = list(dict.fromkeys(rule.stage for rule in own_rules))
    lines = [HEADER]
    for stage in stages:
        lines.append(f"- **{stage}**:")
        lines += [f"  - [`{rule.id}`](#{rule.id}): {rule.description}" for rule in own_rules if rule.stage == stage]
    lines.append("")
    for stage in stages:
        lines += [f"## {stage_title(stage)}", ""]
        for rule in (r for r in own_rules if r.stage == stage):
            lines += rule_entry(rule, "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> None:
    text = render()
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
