"""The gate: its own process (`gate/`: the command line, the run of the stages, policy,
outputs), and what every stage agent uses with it: the report model (`model/`) and process
supervision (`supervision/`)."""
