"""The target's own `stages` package (a common name for pipeline steps in ML repos)."""
