from trainer import Trainer


def test_fit_one_epoch() -> None:
    losses = Trainer(batch_size=8).fit(epochs=1)
    assert len(losses) == 16
