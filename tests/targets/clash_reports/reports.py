"""The target's own `reports` module: formats a training summary."""


def summary_line(name: str, losses: list[float]) -> str:
    return f"{name}: {len(losses)} steps, final loss {losses[-1]:.4f}"
