"""A tiny trainer in plain Python: least squares on one feature, by gradient descent."""

LEARNING_RATE = 0.05
POINTS = [(1.0, 2.0), (2.0, 4.1), (3.0, 5.9)]


def descend(steps: int, rate: float) -> list[float]:
    """The loss after each step, fitting y = w * x."""
    weight, losses = 0.0, []
    for _ in range(steps):
        grad = sum(2 * (weight * x - y) * x for x, y in POINTS) / len(POINTS)
        weight -= rate * grad
        losses.append(sum((weight * x - y) ** 2 for x, y in POINTS) / len(POINTS))
    return losses


def fit(steps: int = 6, lr: float | None = None) -> dict[str, float]:
    """What users run: train, and refuse a run whose loss did not fall."""
    losses = descend(steps, LEARNING_RATE if lr is None else lr)
    if not losses[-1] < losses[0]:
        raise RuntimeError(f"the loss did not fall: {losses[0]:.3g} -> {losses[-1]:.3g}")
    return {"first": losses[0], "last": losses[-1]}


def mean_error(weight: float) -> float:
    return sum(abs(weight * x - y) for x, y in POINTS) / len(POINTS)
