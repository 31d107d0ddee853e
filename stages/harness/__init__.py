"""Child-side code every stage shares: it runs inside the target's child processes (the
entrypoint harness, the step budget, a test run as the entrypoint, the warm interpreter's fork
server) or in the probes (the identity map, the site table, exact tensor reads). Code only one
stage's children run lives in that stage's `probe/`."""
