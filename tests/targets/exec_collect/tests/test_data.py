from data_utils import FIELDS


def test_fields():
    assert FIELDS == ["a", "b"]
