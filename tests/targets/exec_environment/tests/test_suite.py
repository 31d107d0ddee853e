import socket

from scaler import scale


def test_downloads_the_vocabulary():
    # Needs the network: the name cannot resolve anywhere (.invalid is reserved).
    socket.getaddrinfo("example.invalid", 80)  # needs the network


def test_plots_the_curve():
    import traingate_fixture_missing_plotting_package  # noqa: F401 - not installed anywhere


def test_scale_doubles():
    assert scale([1, 2], 2) == [2, 4]  # real failure of scale


def test_scale_empty():
    assert scale([], 3) == []


def test_network_error_handled_then_real_assert():
    # A handled network error does not turn the test's own assertion into an environment failure.
    try:
        socket.getaddrinfo("example.invalid", 80)
    except OSError:
        assert scale([0], 1) == [0]  # real failure, raised while the network error is its context


def test_own_module_lacks_a_name():
    from scaler import scale_all  # noqa: F401 - real failure: the target's own module lacks it
