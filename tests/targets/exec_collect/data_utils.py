"""Imported by a test module; one of its imports is not installed."""

import json

import tokenizers_not_installed_anywhere  # planted: ModuleNotFoundError at import

FIELDS = json.loads('["a", "b"]')
