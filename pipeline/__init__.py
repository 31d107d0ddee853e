"""traingate: a staged verification pipeline and CI merge gate for PyTorch training code."""

__version__ = "0.1.0"
