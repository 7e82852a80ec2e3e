"""Fixtures the test modules share. Helpers that are not fixtures live in tests/helpers/.

Markers: `slow` marks subprocess, end-to-end and experiment tests; `pytest -m "not slow"` is
the inner loop, CI runs everything."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
  """A TFDS data directory for the module's built-in datasets (built on first use)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  """One persistent JAX compilation cache for the whole session, this process and every
  subprocess a test starts (they inherit the environment): the suite compiles the same tiny
  programs in many processes, and XLA:CPU compiles dominate their time. The directory is
  shared by pytest-xdist's workers (the parent of their per-worker base temp)."""
  from helpers import tiny_run  # noqa: PLC0415 (imports jax: not at collection)
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent
  os.environ.update(tiny_run.use_compilation_cache(str(base / "jax_cache")))


@pytest.fixture(scope="module", autouse=True)
def free_compiled_programs():
  """Free each module's compiled programs when it ends. Every XLA:CPU executable keeps its own
  memory mappings until it is freed, and an xdist worker runs hundreds of tests: without this,
  one reached 33k mappings of the kernel's default limit of 65,530 (vm.max_map_count), past
  which LLVM fails with "Cannot allocate memory" and the worker crashes. Programs the next
  module needs again come back from the compilation cache above."""
  yield
  import jax  # noqa: PLC0415 (not at collection)
  jax.clear_caches()


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
  """The stand-in trainer (tests/helpers/fake_train.py) the launcher tests run: its module
  name, importable by the launcher's subprocesses."""
  monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'tests' / 'helpers'}{os.pathsep}{ROOT}")
  return "fake_train"
