"""Process supervision, used by the gate and by every stage agent: child processes and their budgets, leftovers, warm interpreters, and the disguise of the child-side modules."""
