"""Fixtures the test modules share. Helpers that are not fixtures live in tests/helpers/.

Markers: `slow` marks subprocess, end-to-end and experiment tests; `pytest -m "not slow"` is
the inner loop, CI runs everything."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
  """A TFDS data directory for the module's built-in datasets (built on first use)."""
  return str(tmp_path_factory.mktemp("tfds"))
