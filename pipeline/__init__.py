"""The gate's own process: schema, configuration, policy, isolation, orchestration, CLI."""
