"""CI-sized runs of the extrapolation and probes experiments, end to end from the command
line: the outputs exist, are well-formed and hold sane values for every scheme."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi", "t5_bias"]


def _run(module, config, workdir, *extra):
  env = dict(os.environ, TFDS_DATA_DIR=str(workdir.parent / "tfds"))
  subprocess.run([sys.executable, "-m", module, "--config", config, "--workdir", str(workdir),
                  *extra], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
  with open(workdir / "results.json") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def extrapolation(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("exp") / "extrapolation"
  return workdir, _run("experiments.extrapolation.run", "configs/extrapolation.py:tiny=true,"
                       "steps=4", workdir)


def test_extrapolation_outputs(extrapolation):
  workdir, results = extrapolation
  L = results["train_length"]
  assert results["eval_lengths"] == [L, 2 * L]
  assert set(results["loss"]) == set(SCHEMES) | {"rope+pi", "rope+yarn"}
  for scheme, row in results["loss"].items():
    for length, loss in row.items():
      if scheme == "learned" and int(length) > L:
        assert loss is None  # not applicable past the table, not a crash
      else:
        assert math.isfinite(loss) and 0 < loss < 10
  assert results["not_applicable"]["learned"] == [2 * L]
  for name in ("results.md", "loss_vs_length.png", "loss_by_position.png"):
    assert (workdir / name).stat().st_size > 0
  assert "not applicable" in (workdir / "results.md").read_text()


def test_probes_outputs(extrapolation, tmp_path):
  lm_workdir, _ = extrapolation
  results = _run("experiments.probes.run", "configs/probes.py:tiny=true,steps=4",
                 tmp_path / "probes", f"--config.experiment.lm_workdir={lm_workdir}")
  assert set(results["agreement"]) == set(SCHEMES)
  assert set(results["retrieval"]) == {"rope", "learned"}
  for r in results["agreement"].values():
    accs = [a for a in r["by_attractors"].values() if a is not None]
    assert accs and all(0 <= a <= 1 for a in accs)
  for scheme, by_n in results["retrieval"].items():
    assert set(by_n) == {"2", "4", "8"}
    for row in by_n.values():
      for acc in row.get("accuracy_by_position", {}).values():
        assert 0 <= acc <= 1
  maps = results["attention_maps"]
  assert maps["pngs"] and all((tmp_path / "probes" / p).exists() for p in maps["pngs"])
  census = maps["census"]["previous_token"]
  assert all(0 <= w <= 1 for layer in census for w in layer)
  for name in ("agreement.png", "retrieval.png", "results.md"):
    assert (tmp_path / "probes" / name).stat().st_size > 0
