"""Code every process runs, the gate's, the agents' and the target's children alike: the two
ends of the result channel, the guard each process installs first, the stack-dump format,
`/proc`, which frames are the target's, the read recorder, the warm interpreter handed down to
an agent. A child side package: its modules import one another relatively and never name the
gate, so that a run's copy is a plain copy of the files (docs/edited-tests.md)."""
