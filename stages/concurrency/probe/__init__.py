"""Instruments of the concurrency stage; they run inside the target's child process."""
