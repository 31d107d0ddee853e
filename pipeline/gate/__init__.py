"""The gate's own process: the command line, the run of the stages, the policy and its sources, waivers, the outputs, split runs and a task's history."""
