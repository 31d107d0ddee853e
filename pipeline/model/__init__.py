"""The report model the gate and the stages share: the schema, the rule table, the stages' registry and interface, the target's configuration, the details base and how findings are built."""
