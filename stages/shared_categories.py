"""Categories more than one stage reports, declared where every stage can import them.

A stage's own categories are declared in its `rules.py`; one that another stage may report as
well lives here, since the stages do not import each other. Its rule stays with the stage that
owns it (`Rule.reported_by_any_stage`).
"""

from __future__ import annotations

from traingate.stages.api import Category

# The target's own code raised or died in a run of the training function: any stage that runs
# it may report it; the execution stage owns the rule (stages/execution/rules.py).
ENTRYPOINT_CRASH = Category("entrypoint-crash")
