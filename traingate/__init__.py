"""traingate: a staged verification pipeline and CI merge gate for PyTorch training code.

This folder is the import root only. The code lives in the top-level folders `pipeline/`,
`stages/` and `reports/`, installed as `traingate.pipeline`, `traingate.stages` and
`traingate.reports` (see `[tool.setuptools.package-dir]` in pyproject.toml), so that a
target repo's own `pipeline`, `stages` or `reports` package can never shadow them.
"""

__version__ = "0.1.0"
