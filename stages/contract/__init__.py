"""What both sides share: the parent-side stages and the child-side harness and probes import
nothing of each other but this package."""
