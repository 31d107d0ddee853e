"""Instruments of the performance stage; they run inside the target's child process."""
