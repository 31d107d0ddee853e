"""What every instrument a stage asks the entrypoint harness to install shares.

An instrument is named by a `module:factory` spec (each stage lists its own in
`stages/<name>/probe/payloads.py`, beside the models of what they hand back); the harness
resolves it inside the target's process, and the factory gives an object with `install(ctx)`
and `collect() -> dict`. The harness hands back each `collect()` result under its spec, or
`{"error": traceback}` when it failed.
"""

from __future__ import annotations

from typing import Any

# What an instrument hands back when its collect() raised.
ERROR_KEY = "error"


def collect_error(payload: dict[str, Any]) -> str | None:
    """The traceback a failed collect() handed back: the payload is then that alone (every
    built-in payload is checked to be either that or its model); None for a payload."""
    error = payload[ERROR_KEY] if set(payload) == {ERROR_KEY} else None
    return error if isinstance(error, str) else None
