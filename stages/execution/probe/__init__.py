"""The execution stage's child side: the pytest launcher and the plugins it injects into the
target's test run (events, accounting, each test's optimizer steps); they run inside the pytest
child."""
