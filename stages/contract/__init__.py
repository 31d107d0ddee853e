"""The messages both sides agree on, and nothing that runs: the typed requests and results that
cross a process boundary (`messages`), the pytest plugin's events (`pytest_events`), what every
instrument payload shares (`payloads`). The parent-side stages and the child-side harness and
probes import nothing of each other but this package and `stages/common/`."""
