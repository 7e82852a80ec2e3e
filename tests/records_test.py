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
  assert "move the run directory away" in lines[0]


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


def _checkpoint(run, step, committed=True):
  path = run / "checkpoints" / str(step)
  (path / "params").mkdir(parents=True)
  (path / "params" / "d").write_text(f"{run.name} {step}")
  if committed:
    (path / "commit_success.txt").write_text("")
  return path


def test_stash_keeps_each_chains_newest_checkpoint_and_restore_puts_it_back(tmp_path):
  runs, saved = tmp_path / "runs", tmp_path / "saved"
  chain = runs / "kv" / "runs" / "t5_bias"
  _checkpoint(chain / "seed1_warm", 500)
  _checkpoint(chain / "seed1_warm", 1000)
  (chain / "seed1_warm" / "summary.json").write_text('{"step": 1000}')
  _checkpoint(chain / "seed1_warm2", 250)
  _checkpoint(chain / "seed1_warm2", 500, committed=False)  # cut mid-write: not a checkpoint
  _checkpoint(chain / "seed2_warm", 250)
  (chain / "seed1_warm2" / "metrics.jsonl").write_text('{"step": 250}\n')  # unfinished: no record
  os.utime(chain / "seed1_warm" / "checkpoints" / "1000" / "commit_success.txt", (1, 1))
  held = records.stash(str(runs), str(saved), ["kv/runs/t5_bias/seed1_*",
                                               "kv/runs/t5_bias/seed2_*"])
  assert held == ["kv/runs/t5_bias/seed1_warm2/checkpoints/250",
                  "kv/runs/t5_bias/seed2_warm/checkpoints/250"]
  records.copy(str(runs), str(saved), overwrite=True)
  assert not list((saved / "kv").rglob("checkpoints"))  # records stay checkpoint-free

  # A second stash replaces the first; restore fills only runs without a checkpoint.
  assert records.stash(str(runs), str(saved), ["kv/runs/t5_bias/seed1_*"]) == held[:1]
  assert not (saved / records.IN_FLIGHT / "kv/runs/t5_bias/seed2_warm").exists()
  other = tmp_path / "other"
  records.copy(str(saved), str(other), overwrite=False)
  assert records.unstash(str(saved), str(other)) == [held[0]]
  assert (other / held[0] / "params" / "d").read_text() == "seed1_warm2 250"
  assert (other / "kv/runs/t5_bias/seed1_warm/summary.json").exists()
  assert (other / "kv/runs/t5_bias/seed1_warm2/metrics.jsonl").read_text() == '{"step": 250}\n'
  assert records.unstash(str(saved), str(other)) == []  # its own checkpoint now
  # A stash killed between its two renames left only in_flight.old: restore reads it, and
  # neither save nor the swapped-arguments check takes its checkpoints for runs.
  (saved / records.IN_FLIGHT).rename(saved / (records.IN_FLIGHT + ".old"))
  records.copy(str(runs), str(saved), overwrite=True)
  fresh = tmp_path / "fresh"
  records.copy(str(saved), str(fresh), overwrite=False)
  assert not (fresh / records.IN_FLIGHT).exists() and not (fresh / "in_flight.old").exists()
  assert records.unstash(str(saved), str(fresh)) == [held[0]]
  assert sorted(p.name for p in saved.iterdir() if p.name.startswith("in_flight")) == [
      records.IN_FLIGHT]
  with pytest.raises(ValueError, match="no run directory"):
    records.stash(str(runs), str(saved), ["kv/runs/rope/*"])


def test_restore_leaves_the_stash_to_unstash(tmp_path):
  # A stashed run with a summary (a stage's, training went on) is not a record to restore: its
  # copy under RUNS/in_flight would go back over a newer stash on the next save.
  runs, saved, other = (tmp_path / d for d in ("runs", "saved", "other"))
  _checkpoint(runs / "kv" / "runs" / "rope" / "seed0", 1200)
  (runs / "kv" / "runs" / "rope" / "seed0" / "summary.json").write_text('{"step": 1000}')
  records.stash(str(runs), str(saved), ["kv/runs/rope/seed0"])
  records.copy(str(saved), str(other), overwrite=False)
  assert not (other / records.IN_FLIGHT).exists()


@pytest.mark.slow
def test_a_run_cut_on_one_machine_resumes_on_another_from_its_stash(data_dir, tmp_path):
  """The stash is an orbax checkpoint that trains on: the run stopped at step 4 on machine a
  goes on from step 4 on machine b, which has only the committed records and stash."""
  tiny_run = str(ROOT / "tests" / "helpers" / "tiny_run.py")
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  def tiny(workdir, *extra):
    return subprocess.run([sys.executable, tiny_run, "--workdir", str(workdir), "--data_dir",
                           data_dir, "--set", "train.steps=8", "--set",
                           "train.checkpoint_every=2", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout
  run_a, run_b = tmp_path / "a" / "runs" / "x" / "seed0", tmp_path / "b" / "runs" / "x" / "seed0"
  tiny(run_a, "--signal_at_step", "4:SIGTERM")
  assert not (run_a / "summary.json").exists()
  saved = tmp_path / "saved"
  records.copy(str(tmp_path / "a"), str(saved), overwrite=True)  # nothing: it is unfinished
  records.stash(str(tmp_path / "a"), str(saved), ["runs/x/seed*"])
  records.copy(str(saved), str(tmp_path / "b"), overwrite=False)
  records.unstash(str(saved), str(tmp_path / "b"))
  out = tiny(run_b)
  assert "resumed from step 4" in out, out
  rows = [json.loads(line) for line in (run_b / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))


def test_save_with_its_arguments_swapped_is_refused_and_copies_nothing(tmp_path):
  """`save DEST RUNS` (restore's order) would put the committed copies over the runs' newer
  files: a DEST holding runs with checkpoints is refused, naming the swap."""
  runs, saved = tmp_path / "runs", tmp_path / "saved"
  run = runs / "runs" / "rope" / "seed0"
  _checkpoint(run, 4)
  (run / "summary.json").write_text('{"step": 4}')
  records.copy(str(runs), str(saved), overwrite=True)
  (run / "summary.json").write_text('{"step": 8}')  # the run went on
  with pytest.raises(ValueError, match=rf"{runs} holds runs with checkpoints \({run}\), so it is "
                                       rf"RUNS, not DEST: .*did you mean `save {runs} {saved}`"):
    records.copy(str(saved), str(runs), overwrite=True)
  assert json.loads((run / "summary.json").read_text()) == {"step": 8}
  proc = subprocess.run([sys.executable, "-m", "experiments.records", "save", str(saved),
                         str(runs)], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 1 and proc.stderr.startswith(f"error: {runs} holds runs"), proc.stderr
  assert json.loads((run / "summary.json").read_text()) == {"step": 8}
  assert records.copy(str(saved), str(runs), overwrite=False) == []  # restore still goes


def _sweep_record(path, *lrs):
  runs = [{"name": f"lr={lr}", "command": ["python", "-m", "transformer.train",
                                            f"--workdir=x/lr={lr}", f"--config.opt.lr={lr}"]}
          for lr in lrs]
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"runs": runs}))


def test_save_refuses_another_sweep_over_a_recorded_one_and_nested_directories(tmp_path):
  runs, saved = tmp_path / "runs", tmp_path / "saved"
  for lr in ("0.001", "0.003"):
    (runs / f"lr={lr}").mkdir(parents=True)
    (runs / f"lr={lr}" / "summary.json").write_text('{"step": 4}')
  _sweep_record(runs / "sweep.json", "0.001", "0.003")
  records.copy(str(runs), str(saved), overwrite=True)
  recorded = (saved / "sweep.json").read_text()
  other = tmp_path / "other"
  (other / "lr=0.01").mkdir(parents=True)
  (other / "lr=0.01" / "summary.json").write_text('{"step": 4}')
  _sweep_record(other / "sweep.json", "0.01")
  with pytest.raises(ValueError, match=r"saved/sweep.json records another sweep than .*other/"
                                       r"sweep.json \(its run 'lr=0.001' is not in this sweep\); "
                                       r"save it into a new DEST \(nothing was copied\)"):
    records.copy(str(other), str(saved), overwrite=True)
  assert (saved / "sweep.json").read_text() == recorded and not (saved / "lr=0.01").exists()
  # An extended grid keeps every recorded run: saved, with the launcher's earlier record.
  (runs / "sweep.json").rename(runs / "sweep.1.json")
  _sweep_record(runs / "sweep.json", "0.001", "0.003", "0.01")
  assert sorted(records.copy(str(runs), str(saved), overwrite=True)) == [
      "sweep.1.json", "sweep.json"]
  for src, dest, inner in ((runs, runs / "records", runs / "records"), (runs / "lr=0.001", runs,
                           runs / "lr=0.001"), (runs, runs, None)):
    with pytest.raises(ValueError, match=rf"{inner} lies inside|are the same directory"):
      records.copy(str(src), str(dest), overwrite=True)
  assert not (runs / "records").exists()
