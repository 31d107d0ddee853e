"""Loss scaling helpers."""


def scale_loss(loss: float, scale: float) -> float:
    return loss / scale  # planted defect: divides where it should multiply
