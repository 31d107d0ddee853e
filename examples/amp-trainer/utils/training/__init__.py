"""Metrics tracking, AMP helpers and the AMP speedup benchmark."""

from utils.training.amp_utils import AmpWandbCallback, compute_effective_precision
from utils.training.metrics_tracker import MetricsTracker

__all__ = ["AmpWandbCallback", "MetricsTracker", "compute_effective_precision"]
