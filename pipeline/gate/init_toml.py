"""`traingate init`, third part: the commented `traingate.toml` it writes (or prints).

Keys init decided are written as keys, each with a comment saying why; keys it could not
decide are commented out, saying what to fill in. The text is read back as TOML and as the
target's configuration before it is written (`check_written`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from traingate.pipeline.gate.init_propose import MAX_BATCHES, MAX_STEPS, Candidate, json_str
from traingate.pipeline.model.tomlcompat import tomllib

# A line `render` commented out: a key, a table header, or a continued list's line.
DISABLED = re.compile(r"# (\[|[a-z_]+ = |  |\])")
TOP_KEYS = ("script", "workdir", "prepare", "call", "setup", "args", "amp_args", "amp_flag", "max_batches", "max_steps")


def toml_value(value: Any) -> str:
    """A TOML literal of the values init writes (strings, numbers, booleans, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML literal for {type(value).__name__}")


KEY_COMMENTS = {
    "script": "run as `python {value}` runs it, as __main__",
    "workdir": "the folder it runs in, as the README runs it",
    "prepare": "run first, as the README runs it before training (its data)",
    "call": "module:function or module:Class.method: of the repo, or an installed framework's",
    "amp_args": "the option that switches mixed precision: AMP on vs off is compared",
    "amp_flag": "the keyword that switches mixed precision: AMP on vs off is compared",
    "max_batches": "the step budget: every DataLoader iteration stops after this many batches",
    "max_steps": "... and the run stops after this many optimizer steps (a controlled stop)",
}


def render(candidate: Candidate, header: list[str], tests_line: str | None, *, active: bool = True, unverified: str | None = None) -> str:
    """The whole file: header comments, the top-level keys, `[entrypoint]`, `[entrypoint.kwargs]`.
    Not `active` (its check run did not verify it): the entrypoint's lines are written commented
    out, so that `traingate run` runs as with no configuration until they are filled in."""
    lines = top_lines(header, [tests_line] if tests_line is not None else [], unverified)
    body = entrypoint_lines(candidate)
    lines += body if active else [line if not line or line.startswith("#") else f"# {line}" for line in body]
    return "\n".join(lines) + "\n"


def enabled(text: str) -> str:
    """The file as its user enables the proposal: the lines init wrote commented out uncommented,
    its FILL IN lines (and the header) left as they are."""
    return "\n".join(
        line[2:] if DISABLED.match(line) and "FILL IN" not in line else line for line in text.splitlines()
    ) + "\n"


def top_lines(header: list[str], keys: list[str], unverified: str | None) -> list[str]:
    """The header comments, then the top-level keys (`unverified` first where init could not verify)."""
    lines = [f"# {text}" if text else "#" for text in header]
    lines.append("")
    if unverified is not None:
        lines += ["# What `traingate run` repeats until the configuration is right (delete it then):", f"unverified = {json_str(unverified)}"]
    lines += keys
    return lines + ([""] if unverified is not None or keys else [])


def entrypoint_lines(candidate: Candidate) -> list[str]:
    lines = ["[entrypoint]"]
    ep = candidate.entrypoint
    for key in TOP_KEYS:
        if key == "args" and "script" in ep:
            lines += _args_lines(ep.get("args", []), candidate.args_comments)
        elif key in ep:
            comment = KEY_COMMENTS.get(key, "").format(value=ep[key])
            lines.append(f"{key} = {toml_value(ep[key])}" + (f"   # {comment}" if comment else ""))
        for fill in candidate.fill_in:
            if fill.key == key and fill.line:
                lines.append(fill.line)
    kwargs_fill = [f for f in candidate.fill_in if f.key.startswith("kwargs.")]
    if candidate.kwargs or kwargs_fill:
        lines += ["", "[entrypoint.kwargs]   # keyword arguments of the call"]
        lines += [f"{k} = {toml_value(v)}" for k, v in candidate.kwargs.items()]
        lines += [f.line for f in kwargs_fill]
    return lines


def _args_lines(args: list[str], comments: list[str]) -> list[str]:
    if not comments:
        return [f"args = {toml_value(args)}"]
    pairs = [args[i : i + 2] for i in range(0, len(args), 2)]
    body = [f"  {', '.join(toml_value(a) for a in pair)}," for pair in pairs]
    return ["args = [", *body, *(f"  {c}" for c in comments), "]"]


def check_written(text: str, root: Path) -> str | None:
    """None when the text is the target's valid configuration as it stands; else why not (a
    FILL IN still to be done can make it so)."""
    from traingate.pipeline.gate.config_file import ConfigError, check_entrypoint
    from traingate.pipeline.model.config import TargetConfig
    from pydantic import ValidationError

    try:
        config = TargetConfig.model_validate(tomllib.loads(text))
        check_entrypoint(root, config, "traingate.toml", "traingate")
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML: {exc}"
    except ValidationError as exc:
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
    except ConfigError as exc:
        return str(exc)
    return None


def budget_note() -> str:
    return f"The step budget (max_batches = {MAX_BATCHES}, max_steps = {MAX_STEPS}) keeps the training's own defaults short."
