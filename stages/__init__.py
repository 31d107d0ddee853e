"""The stages: one package each (`stage.py` parent side, `probe/` child side), behind `traingate.stages.base.Stage`."""
