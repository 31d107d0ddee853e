"""The stages: one module each, behind `stages.base.Stage`."""
