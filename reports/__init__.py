"""Renderers: pure functions from a PipelineReport to text."""

from traingate.reports.render import render_report_md, render_stage_md, render_summary

__all__ = ["render_report_md", "render_stage_md", "render_summary"]
