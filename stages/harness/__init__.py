"""Child-side code shared by every stage: it runs inside the target's child processes."""
