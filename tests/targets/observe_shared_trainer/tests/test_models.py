import math

from models import Classifier, ScoredClassifier
from trainer import fit


def test_classifier_fits_six_steps() -> None:
    assert math.isfinite(fit(Classifier(), steps=6))


def test_scored_classifier_fits_four_steps() -> None:
    assert math.isfinite(fit(ScoredClassifier(), steps=4))
