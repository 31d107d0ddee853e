"""Instruments of the correctness stage; they run inside the target's child process."""
