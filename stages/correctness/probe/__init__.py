"""Instruments of the correctness stage, and the torchrun launcher of its distributed runs
(`distributed`); they run inside the target's child processes."""
