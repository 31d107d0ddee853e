import train


def test_the_script_imports_without_training():
    assert callable(train.main)
