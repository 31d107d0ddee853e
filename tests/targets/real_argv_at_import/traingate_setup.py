import sys


def tiny_adding():
    # run.py reads sys.argv when it is imported, which happens after this returns.
    sys.argv = ["run.py", "--epochs", "0", "--samples", "320", "--batch_size", "16", "--seq_len", "12"]
    return {"epoch": 1}
