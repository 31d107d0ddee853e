"""The execution stage: the test suite under coverage, and a smoke call of the entrypoint.

Nothing is imported here: `probe/` runs inside the target's child process and must not pull
the parent side (`stage.py` and its analyses) in with it.
"""
