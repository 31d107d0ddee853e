import threading


def test_quick():
    assert True


def test_waits_forever():
    done = threading.Event()
    done.wait()  # planted: nothing ever sets it
