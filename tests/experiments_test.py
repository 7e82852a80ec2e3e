"""CI-sized runs of the extrapolation and probes experiments, end to end from the command
line: the outputs exist, are well-formed and hold sane values for every scheme."""

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMES = ["none", "sinusoidal", "sinusoidal_unscaled", "learned", "rope", "alibi", "t5_bias"]
TINY = "configs/extrapolation.py:tiny=true,steps=4"


def _command(module, config, workdir, *extra, check=True):
  env = dict(os.environ, TFDS_DATA_DIR=str(workdir.parent / "tfds"))
  return subprocess.run([sys.executable, "-m", module, "--config", config, "--workdir",
                         str(workdir), *extra], cwd=ROOT, env=env, check=check,
                        capture_output=True, text=True)


def _run(module, config, workdir, *extra):
  _command(module, config, workdir, *extra)
  with open(workdir / "results.json") as f:
    return json.load(f)


def _error(module, config, workdir, *extra) -> str:
  """The one line a command that must refuse prints (no traceback)."""
  proc = _command(module, config, workdir, *extra, check=False)
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  return lines[0]


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
  for key in ("loss", "loss_sliding"):
    for scheme, row in results[key].items():
      for length, cell in row.items():
        if scheme == "learned" and int(length) > L:
          assert cell is None  # not applicable past the table, not a crash
        else:
          assert math.isfinite(cell["mean"]) and 0 < cell["mean"] < 10
          lo, hi = cell["ci95_windows"]
          assert lo <= cell["mean"] <= hi and cell["seeds"] == 1
  assert results["not_applicable"]["learned"] == [2 * L]
  assert min(g["nats"] for g in results["gap_at_L"].values()) == 0
  assert results["tokens_per_word"] > 1 and 0 < results["unigram_entropy"] < 6
  assert all(r > 0 for r in results["tokens_per_parameter"].values())
  for name in ("results.md", "loss_vs_length.png", "loss_by_position.png"):
    assert (workdir / name).stat().st_size > 0
  md = (workdir / "results.md").read_text()
  assert "not applicable" in md and "gap at L" in md and "tokens per word" in md
  # The main sinusoidal row scales the embeddings (Vaswani et al.), the ablation does not.
  configs = {s: json.loads((workdir / "runs" / s / "seed0" / "config.json").read_text())
             for s in ("sinusoidal", "sinusoidal_unscaled")}
  assert configs["sinusoidal"]["model"]["scale_embeddings"] is True
  assert configs["sinusoidal_unscaled"]["model"]["scale_embeddings"] is False
  assert configs["sinusoidal_unscaled"]["model"]["position"]["name"] == "sinusoidal"


def test_extrapolation_seeds_train_one_run_each_and_resume(extrapolation):
  workdir = _copy_run(extrapolation, "seeds")  # seed 0 finished: skipped, seed 1 trained
  results = _run("experiments.extrapolation.run", TINY, workdir,
                 "--config.experiment.schemes=none", "--config.experiment.seeds=0,1")
  _, fixture = extrapolation
  assert (workdir / "runs" / "none" / "seed1" / "summary.json").exists()
  cell = results["loss"]["none"][str(results["train_length"])]
  assert cell["seeds"] == 2 and cell["sd"] > 0
  assert cell["per_seed"][0] == pytest.approx(
      fixture["loss"]["none"][str(results["train_length"])]["mean"], abs=1e-5)


def test_probes_outputs(extrapolation, tmp_path):
  lm_workdir, _ = extrapolation
  results = _run("experiments.probes.run", "configs/probes.py:tiny=true,steps=4",
                 tmp_path / "probes", f"--config.experiment.lm_workdir={lm_workdir}")
  assert set(results["agreement"]) == set(SCHEMES)
  assert set(results["retrieval"]) == {"rope", "learned"}
  for by_seed in results["agreement"].values():
    for r in by_seed.values():
      cells = [c for c in r["by_attractors"].values() if c is not None]
      assert cells and all(0 <= c["accuracy"] <= 1 for c in cells)
      assert all(c["wilson95"][0] <= c["accuracy"] <= c["wilson95"][1] for c in cells)
  for scheme, by_seed in results["retrieval"].items():
    for by_n in by_seed.values():
      assert set(by_n) == {"2", "4", "8"}
      for row in by_n.values():
        for cell in row.get("accuracy_by_position", {}).values():
          assert 0 <= cell["accuracy"] <= 1 and cell["n"] == 4
  assert set(results["census"]) == set(SCHEMES)
  assert all(set(by_seed) == {"0"} for by_seed in results["census"].values())
  census = results["census"]["rope"]["0"]["census"]
  assert all(0 <= w <= 1 for layer in census["previous_token"] for w in layer)
  assert {"head_noun", "nearest_attractor", "subject_minus_attractor"} <= set(census)
  maps = results["attention_maps"]
  assert maps["pngs"] and all((tmp_path / "probes" / p).exists() for p in maps["pngs"])
  assert maps["max_row_sum_error"] < 1e-4
  # The LM-pretrained variant (tiny: rope): the LM run of the same scheme and seed, then the
  # retrieval warm-up from its parameters, then retrieval from the warm-up's, evaluated like
  # the others.
  pretrained = tmp_path / "probes" / "kv_lm" / "runs" / "rope" / "seed0"
  warm = json.loads((tmp_path / "probes" / "kv_lm" / "runs" / "rope" / "seed0_warm"
                     / "config.json").read_text())
  saved = json.loads((pretrained / "config.json").read_text())
  lm_run = json.loads((lm_workdir / "runs" / "rope" / "seed0" / "config.json").read_text())
  assert warm["train"]["init_from"] == str(lm_workdir / "runs" / "rope" / "seed0")
  assert (warm["data"]["num_pairs"], warm["data"]["min_pairs"]) == (2, 0)
  assert saved["train"]["init_from"] == str(pretrained) + "_warm"
  assert saved["model"] == lm_run["model"] == warm["model"]
  assert saved["data"]["name"] == "kv_retrieval" and saved["data"]["min_pairs"] == 2
  assert set(results["retrieval_lm_pretrained"]) == {"rope"}
  for row in results["retrieval_lm_pretrained"]["rope"]["0"].values():
    for cell in row.get("accuracy_by_position", {}).values():
      assert 0 <= cell["accuracy"] <= 1 and cell["n"] == 4
  assert set(results["retrieval_criterion_lm_pretrained"]["rope"]["0"]) >= {"met", "attempts"}
  assert "rope (LM-pretrained)" in (tmp_path / "probes" / "results.md").read_text()
  for name in ("agreement.png", "retrieval.png", "results.md"):
    assert (tmp_path / "probes" / name).stat().st_size > 0


def _copy_run(extrapolation, name, scheme="none"):
  """A new workdir (next to the fixture's, sharing its TFDS folder) holding a copy of one of
  the fixture's finished runs, so a test can re-run on it without touching the fixture."""
  workdir, _ = extrapolation
  copy = workdir.parent / name
  shutil.copytree(workdir / "runs" / scheme / "seed0", copy / "runs" / scheme / "seed0")
  return copy


def test_extrapolation_evaluation_cache_is_keyed_by_its_settings(extrapolation):
  _, results = extrapolation
  workdir = _copy_run(extrapolation, "resplit")  # its cache holds the fixture's evaluation
  again = _run("experiments.extrapolation.run", TINY, workdir,
               "--config.experiment.schemes=none", "--config.experiment.eval_split=test",
               "--config.experiment.eval_tokens=256")
  assert again["eval_tokens"] == 256
  # Other tokens of another split: not the cached validation/512 numbers.
  assert again["loss"]["none"] != results["loss"]["none"]
  assert again["loss_sliding"]["none"] != results["loss_sliding"]["none"]
  # The fixture's settings still find their entry: kept, not overwritten.
  # Bookkeeping keys (checkpoint.BOOKKEEPING_KEYS) may differ: the finished run is reused.
  same = _run("experiments.extrapolation.run", TINY, workdir, "--config.experiment.schemes=none",
              "--config.train.profile_steps=1:2", "--config.train.log_every=3")
  assert same["loss"]["none"] == results["loss"]["none"]


def test_finished_run_of_another_config_is_refused(extrapolation):
  workdir = _copy_run(extrapolation, "wider")
  error = _error("experiments.extrapolation.run", TINY, workdir,
                 "--config.experiment.schemes=none", "--config.model.d_model=128")
  assert "model.d_model: 64 there vs 128 now" in error and "new --workdir" in error
  assert not (workdir / "results.json").exists()


@pytest.mark.parametrize("module,config,flag,message", [
    ("experiments.extrapolation.run", TINY, "--config.experiment.schemes=none,bogus",
     "unknown scheme 'bogus' in experiment.schemes"),
    ("experiments.extrapolation.run", TINY, "--config.experiment.eval_tokens=100000000",
     "need 100000000 (lower experiment.eval_tokens)"),
    ("experiments.probes.run", "configs/probes.py:tiny=true,steps=4",
     "--config.experiment.kv_schemes=rope,bogus",
     "unknown scheme 'bogus' in experiment.kv_schemes"),
    ("experiments.probes.run", "configs/probes.py:tiny=true,steps=4",
     "--config.experiment.kv_max_steps=1", "need 1 <= kv_steps <= kv_max_steps"),
])
def test_bad_experiment_settings_are_one_line_before_training(extrapolation, module, config,
                                                              flag, message):
  workdir = extrapolation[0].parent / "bad"
  error = _error(module, config, workdir, "--config.experiment.schemes=none", flag)
  assert message in error
  assert not workdir.exists() or not any(workdir.iterdir())  # nothing trained


def test_probes_refuse_a_workdir_of_another_experiment(extrapolation):
  lm_workdir, _ = extrapolation
  # The extrapolation's results.json as one written before results.json named its
  # experiment (only the command says it): the probes would overwrite it and results.md.
  workdir = lm_workdir.parent / "probes_in_extrapolation"
  workdir.mkdir()
  saved = json.loads((lm_workdir / "results.json").read_text())
  saved.pop("experiment", None)
  (workdir / "results.json").write_text(json.dumps(saved))
  error = _error("experiments.probes.run", "configs/probes.py:tiny=true,steps=4", workdir,
                 f"--config.experiment.lm_workdir={lm_workdir}")
  assert "written by experiments.extrapolation.run" in error and "new --workdir" in error
  assert json.loads((workdir / "results.json").read_text()) == saved
  assert sorted(p.name for p in workdir.iterdir()) == ["results.json"]
