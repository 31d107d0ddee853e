"""A tiny training step with a planted defect: the update has the wrong sign."""


def sgd_step(weight: float, grad: float, lr: float = 0.1) -> float:
    return weight + lr * grad
