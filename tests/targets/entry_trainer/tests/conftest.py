import os

os.environ.setdefault("TRAINLIB_DEVICE", "cpu")
