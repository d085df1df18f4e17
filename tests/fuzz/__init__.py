"""Fuzzing of every input surface: `python -m tests.fuzz --help` (see `tests/fuzz/__main__.py`)."""
