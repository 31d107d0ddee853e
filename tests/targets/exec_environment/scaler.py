"""A helper with a real defect for the suite to find."""


def scale(values, factor):
    return [v * factor + 1 for v in values]  # planted: the + 1 is a bug
