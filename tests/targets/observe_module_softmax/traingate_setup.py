"""Used only when the same repo is checked with a hand-written entrypoint (the comparison test)."""

from lit.module import LitClassifier
from lit.trainer import MiniTrainer, loader


def fit_objects() -> dict[str, object]:
    return {"self": MiniTrainer(max_steps=8), "module": LitClassifier(), "loader": loader(batch_size=8)}
