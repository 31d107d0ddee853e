"""The performance stage: steps, memory held per step, host syncs, AMP on vs off, input stalls.

Nothing is imported here: `probe/` runs inside the target's child process and must not pull
the parent side (`stage.py` and its analyses) in with it.
"""
