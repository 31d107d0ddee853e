"""The correctness stage: training bugs that run fine and pass the tests, but make the model
learn less or differently (steps that change nothing, parameters never trained, losses that
cannot go down, unshuffled data, gradient accumulation that is not a larger batch).

Nothing is imported here: `probe/` runs inside the target's child process and must not pull
the parent side (`stage.py` and its analyses) in with it.
"""
