"""The stage agent's process (parent side): `python -P -m traingate.stages.agent` (`__main__`)
runs one stage, and the modules beside it are what the stages share in that process (the
session of a stage that observes training, the findings several stages make: a crash, a missing
package; a test run as the entrypoint). Nothing here runs in the target's processes."""
