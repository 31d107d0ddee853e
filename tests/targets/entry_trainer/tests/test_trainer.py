from trainlib.trainer import Trainer


def test_fit_lowers_the_loss():
    trainer = Trainer(lr=0.05, samples=64)
    first = trainer.fit(epochs=1)
    assert trainer.fit(epochs=3) < first
