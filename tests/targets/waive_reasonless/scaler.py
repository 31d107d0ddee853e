"""A tiny loss-scaling helper whose tests fail in four places, each accepted (or not) differently."""


def scale(value: float, factor: float) -> float:
    return value * factor
