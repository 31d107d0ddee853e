"""The stages and the processes they run in: `agent/` and `base.py` (the stage agent's process),
one package per stage (its parent side, in the agent; its `probe/`, the child side, in the
target's processes), `harness/` (the child side every stage shares), `common/` (code every
process runs) and `contract/` (the messages between them). docs/architecture.md shows which
folder runs where."""
