"""Code that runs inside the child processes that execute the target's code."""
