"""A tiny trainer in plain Python: least squares on one feature, by gradient descent."""

LEARNING_RATE = 0.05
POINTS = [(1.0, 2.0), (2.0, 4.1), (3.0, 5.9)]


def train(steps: int = 6, lr: float | None = None) -> list[float]:
    """The loss after each step, fitting y = w * x."""
    rate = LEARNING_RATE if lr is None else lr
    weight, losses = 0.0, []
    for _ in range(steps):
        grad = sum(2 * (weight * x - y) * x for x, y in POINTS) / len(POINTS)
        weight -= rate * grad
        losses.append(sum((weight * x - y) ** 2 for x, y in POINTS) / len(POINTS))
    return losses
