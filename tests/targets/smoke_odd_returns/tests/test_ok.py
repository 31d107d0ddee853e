from train import Unprintable


def test_unprintable_is_an_object():
    assert isinstance(Unprintable(), object)
