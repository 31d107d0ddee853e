"""Feature code that needs a second package the runner lacks."""

import traingate_absent_pkg_second  # planted: the second missing package


def featurize(x):
    return traingate_absent_pkg_second.normalize(x)
