"""A tiny trainer in plain Python: least squares on one feature, by gradient descent."""

LEARNING_RATE = 0.1


def fit(points: list[tuple[float, float]], steps: int) -> list[float]:
    """The loss after each step, fitting y = w * x."""
    weight, losses = 0.0, []
    for _ in range(steps):
        grad = sum(2 * (weight * x - y) * x for x, y in points) / len(points)
        weight -= LEARNING_RATE * grad
        losses.append(sum((weight * x - y) ** 2 for x, y in points) / len(points))
    return losses
