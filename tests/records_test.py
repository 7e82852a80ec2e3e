"""experiments/records.py: a sweep's records (summaries, configs, cached evaluations) carry its
results to another machine, where the experiments resume without checkpoints and write the
same results; neither direction of the copy loses what the other side holds."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import records

ROOT = pathlib.Path(__file__).resolve().parents[1]
LM = ("experiments.extrapolation.run", "configs/extrapolation.py:tiny=true,steps=4",
      "--config.experiment.schemes=rope")
PROBES = ("experiments.probes.run", "configs/probes.py:tiny=true,steps=4",
          "--config.experiment.schemes=rope", "--config.experiment.kv_schemes=rope",
          "--config.experiment.kv_pretrained_schemes=rope")


def _command(command, workdir, *extra, check=True):
  module, config, *flags = command
  env = dict(os.environ, TFDS_DATA_DIR=str(workdir.parent / "tfds"))
  proc = subprocess.run([sys.executable, "-m", module, "--config", config, *flags, "--workdir",
                         str(workdir), *extra], cwd=ROOT, env=env, capture_output=True,
                        text=True)
  assert not check or proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _sweep(root):
  """The LM experiment and the probes (retrieval and LM-pretrained retrieval) under root."""
  _command(LM, root / "lm")
  _command(PROBES, root / "probes", f"--config.experiment.lm_workdir={root / 'lm'}")
  return {name: json.loads((root / name / "results.json").read_text())
          for name in ("lm", "probes")}


def _comparable(results, root):
  """Results without what names the machine's paths or times the invocation."""
  text = json.dumps({k: v for k, v in results.items() if k not in ("wall_time_s", "command")},
                    sort_keys=True)
  return json.loads(text.replace(str(root), "ROOT"))


@pytest.mark.slow
def test_a_sweep_resumes_from_its_records_alone(tmp_path):
  first = _sweep(tmp_path / "a")
  saved = tmp_path / "records"
  copied = records.copy(str(tmp_path / "a"), str(saved), overwrite=True)
  assert copied and all(os.path.basename(p) in records.RECORD_FILES for p in copied)
  assert "lm/runs/rope/seed0/extrapolation_eval.json" in copied
  assert not list(saved.rglob("checkpoints"))
  records.copy(str(saved), str(tmp_path / "b"), overwrite=False)

  again = _sweep(tmp_path / "b")  # nothing trains, nothing loads: there are no checkpoints
  assert not list((tmp_path / "b").rglob("checkpoints"))
  for name in first:
    assert _comparable(again[name], tmp_path / "b") == _comparable(first[name], tmp_path / "a")

  # An evaluation the records lack needs the model: a one-line error says what to do.
  proc = _command(LM, tmp_path / "b" / "lm", "--config.experiment.eval_tokens=256",
                  check=False)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "holds only its records" in lines[0], proc.stderr[-2000:]
  assert "summary.json" in lines[0]


def test_save_replaces_changed_records_and_restore_never_overwrites(tmp_path):
  run = tmp_path / "runs" / "runs" / "rope" / "seed0"
  (run / "checkpoints" / "4").mkdir(parents=True)
  (run / "checkpoints" / "4" / "summary.json").write_text("{}")  # not a record: skipped
  (run / "summary.json").write_text('{"step": 4}')
  (run / "metrics.jsonl").write_text("{}\n")
  saved = tmp_path / "saved"
  unfinished = tmp_path / "runs" / "runs" / "rope" / "seed1"
  unfinished.mkdir()
  (unfinished / "metrics.jsonl").write_text("{}\n")  # restarts on another machine: not saved
  (tmp_path / "runs" / "sweep.json").write_text("{}")
  assert sorted(records.copy(str(tmp_path / "runs"), str(saved), True)) == [
      "runs/rope/seed0/metrics.jsonl", "runs/rope/seed0/summary.json", "sweep.json"]
  assert records.copy(str(tmp_path / "runs"), str(saved), True) == []  # unchanged
  (run / "summary.json").write_text('{"step": 8}')
  records.copy(str(tmp_path / "runs"), str(saved), True)
  assert json.loads((saved / "runs/rope/seed0/summary.json").read_text()) == {"step": 8}

  (run / "summary.json").write_text('{"step": 12}')  # the machine's own copy is newer
  assert records.copy(str(saved), str(tmp_path / "runs"), False) == []
  assert json.loads((run / "summary.json").read_text()) == {"step": 12}
  with pytest.raises(ValueError, match="not a directory of runs"):
    records.copy(str(tmp_path / "missing"), str(saved), False)


def test_cached_computes_once_per_key(tmp_path):
  calls = []
  compute = lambda: calls.append(1) or {1: [0.5]}
  assert records.cached(str(tmp_path), {"a": 1}, compute) == {"1": [0.5]}
  assert records.cached(str(tmp_path), {"a": 1}, compute) == {"1": [0.5]}
  assert records.cached(str(tmp_path), {"a": 2}, compute) == {"1": [0.5]}
  assert len(calls) == 2


def test_run_all_probes_every_scheme_the_configs_name():
  """experiments/run_all.sh trains the language and retrieval models one at a time, so it
  names the schemes itself: the same ones as the configs, or the final gathering step would
  train the missing ones on a machine that may not keep them."""
  from configs import probes  # noqa: PLC0415
  script = (ROOT / "experiments" / "run_all.sh").read_text()
  listed = lambda name: script.split(f'{name}="', 1)[1].split('"', 1)[0].split()
  exp = probes.get_config().experiment
  assert listed("SCHEMES") == exp.schemes.split(",")
  assert listed("KV_SCHEMES") == exp.kv_schemes.split(",")
  assert sorted(listed("PRETRAINED")) == sorted(exp.kv_pretrained_schemes.split(","))
  assert exp.seeds == "0,1,2" and "for seed in 1 2" in script
