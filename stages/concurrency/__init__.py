"""The concurrency stage: GradScaler protocol, same-seed reruns, DataLoader start methods, hangs.

Nothing is imported here: `probe/` runs inside the target's child process and must not pull
the parent side (`stage.py` and its analyses) in with it.
"""
