"""Training utilities for the AMP trainer (task T035: mixed-precision training)."""
