import math

from lit.module import LitClassifier
from lit.trainer import MiniTrainer, loader


def test_fit_runs() -> None:
    assert math.isfinite(MiniTrainer(max_steps=8).fit(LitClassifier(), loader(batch_size=8)))
