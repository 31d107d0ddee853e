import traingate_absent_plot_pkg  # a test-only package the runner lacks


def test_plot():
    assert traingate_absent_plot_pkg is not None
