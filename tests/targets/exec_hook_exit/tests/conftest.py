"""Planted: stops pytest with status 0 once the tests are collected, before any runs."""

import pytest


def pytest_collection_modifyitems(items):
    pytest.exit("nothing to run today", returncode=0)  # planted: exits 0 having run nothing
