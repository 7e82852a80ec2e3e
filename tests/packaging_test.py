"""Packaging: pyproject.toml's ranges hold both tested sets (constraints.txt for Python 3.11,
constraints-py312.txt for 3.12, which .ci/run installs where it can), and the core
install needs none of the optional extras' packages."""

import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
# (TensorFlow is not installed at all: tensorflow_datasets reads array_record without it.)
OPTIONAL = ["matplotlib", "scipy", "torch", "transformers", "tokenizers", "tiktoken", "wandb"]


def _constraints(name: str) -> dict[str, str]:
  lines = (ROOT / name).read_text().splitlines()
  return {canonicalize_name(l.split("==")[0]): l.split("==")[1].strip()
          for l in lines if "==" in l and not l.startswith("#")}


@pytest.mark.parametrize("name", ["constraints.txt", "constraints-py312.txt"])
def test_every_range_holds_the_tested_version(name):
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  pinned = _constraints(name)
  extras = project["optional-dependencies"]
  tested = project["dependencies"] + [r for e in ("test", "interop", "hf", "experiments",
                                                  "wandb") for r in extras[e]]
  for line in tested:
    req = Requirement(line)
    version = pinned.get(canonicalize_name(req.name))
    assert version is not None, f"{req.name} is not in {name}"
    assert req.specifier.contains(version.split("+")[0], prereleases=True), (line, version)
    # A lower bound on every range: what CI tests is the oldest release we promise.
    assert any(s.operator in (">=", "==") for s in req.specifier), line
  assert not any(canonicalize_name(n) in pinned for n in ("transformer",))  # not the project


@pytest.mark.slow  # a subprocess
def test_the_library_imports_without_the_extras_packages():
  # Every module under transformer/, with the extras' packages made unimportable.
  script = f"""
import importlib, pkgutil, sys
for name in {OPTIONAL!r}:
  sys.modules[name] = None
import transformer
ENTRY_POINTS = {{"transformer.train", "transformer.generate", "transformer.inspect",
                "transformer.convert"}}
for m in pkgutil.walk_packages(transformer.__path__, "transformer."):
  if m.name not in ENTRY_POINTS:  # each defines its flags (they clash); their imports are here
    importlib.import_module(m.name)
print("ok")
"""
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
