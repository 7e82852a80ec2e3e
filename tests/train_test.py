"""The training loop end to end on an xs model: outputs, exact resume, signals, bad input."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from helpers import tiny_run
from transformer import data
from transformer.training import checkpoint, sharding, tensorboard_events, loop

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(workdir, data_dir, *flags, check=True, sets=()):
  """tests/tiny_run.py in a subprocess; returns its JSON line (or the CompletedProcess)."""
  cmd = [sys.executable, os.path.join(HERE, "helpers", "tiny_run.py"), "--workdir", str(workdir),
         "--data_dir", data_dir, *flags]
  for s in sets:
    cmd += ["--set", s]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
  if not check:
    return proc
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def params_of(workdir):
  _, _, params, _ = checkpoint.load_for_inference(str(workdir))
  return jax.tree.leaves(jax.device_get(params))


def test_run_writes_config_metrics_events_summary_and_checkpoint(tmp_path, data_dir):
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 4, "train.eval_every": 2,
                                             "train.checkpoint_every": 2})
  summary = loop.train_and_evaluate(config, str(tmp_path))

  assert json.load(open(tmp_path / "config.json"))["model"]["d_model"] == 64
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  for key in ("loss", "learning_rate", "tokens", "tokens_per_s", "step_time_s", "mfu"):
    assert all(key in r for r in rows), key
  assert "compile_time_s" in rows[0]
  assert {"eval_loss", "eval_perplexity", "eval_accuracy"} <= set(rows[1]) & set(rows[3])
  assert rows[3]["tokens"] == 4 * 8 * 32

  events = os.listdir(tmp_path / "tensorboard")
  scalars = tensorboard_events.read_scalars(str(tmp_path / "tensorboard" / events[0]))
  assert (4, "loss", pytest.approx(rows[3]["loss"], rel=1e-6)) in scalars

  on_disk = json.load(open(tmp_path / "summary.json"))
  for key in ("final_eval_loss", "params_total", "params_non_embedding", "tokens", "flops",
              "flops_per_token", "wall_time_s", "step", "config"):
    assert key in on_disk, key
  assert on_disk["flops"] == on_disk["flops_per_token"] * on_disk["tokens"]
  assert on_disk["config"]["model.d_model"] == 64
  # The default corpus' documents outrun 32-token rows, so its floor is only a lower bound.
  floor = data.loss_floor(config.data, data.get_tokenizer(config.data), config.train.eval_split)
  assert on_disk["loss_floor"] == pytest.approx(floor["loss_floor"]) and floor["loss_floor"] > 0
  assert on_disk["loss_floor_exact"] is False
  assert on_disk["loss_floor_z"] == 1.0  # no data.max_doc_tokens: nothing redrawn
  assert summary["final_eval_loss"] == pytest.approx(rows[3]["eval_loss"])

  config, model_config, params, tokenizer = checkpoint.load_for_inference(str(tmp_path))
  assert model_config.d_model == 64 and tokenizer.vocab_size <= model_config.vocab_size
  assert params["embedder"]["embedding"].shape == (model_config.vocab_size, 64)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  out = run(workdir, data_dir, sets=["train.steps=6", "train.checkpoint_every=2"])
  return workdir, out


def test_synchronous_dispatch_trains_the_same_run_and_still_resumes(tmp_path, data_dir,
                                                                    uninterrupted):
  # What the train command does for a large step on the retained heap (host.large_step).
  reference_dir, reference = uninterrupted
  sets = ["train.steps=6", "train.checkpoint_every=2"]
  first = run(tmp_path, data_dir, "--sync_dispatch", "--signal_at_step", "3:SIGTERM", sets=sets)
  assert first["summary"] == {"step": 3, "stopped": True} and first["async_dispatch"] is False
  assert reference["async_dispatch"] is True
  resumed = run(tmp_path, data_dir, "--sync_dispatch", sets=sets)
  assert resumed["losses"] == reference["losses"]
  for a, b in zip(params_of(tmp_path), params_of(reference_dir)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_saves_and_the_resumed_run_is_bitwise_identical(tmp_path, data_dir,
                                                                 uninterrupted, signal_name):
  reference_dir, reference = uninterrupted
  sets = ["train.steps=6", "train.checkpoint_every=2"]
  first = run(tmp_path, data_dir, "--signal_at_step", f"3:{signal_name}", sets=sets)
  assert first["summary"] == {"step": 3, "stopped": True}
  assert 3 in checkpoint.make_manager(str(tmp_path)).all_steps()  # saved off-cadence

  resumed = run(tmp_path, data_dir, sets=sets)
  # Bitwise on CPU: the same compiled program sees the same parameters, optimizer state,
  # step, RNG key and data position, so nothing is left to differ.
  assert resumed["losses"] == reference["losses"]
  for a, b in zip(params_of(tmp_path), params_of(reference_dir)):
    np.testing.assert_array_equal(a, b)
  # Wall time counts both sessions: rows carry it cumulatively, and it never goes back.
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  walls = [r["wall_time_s"] for r in rows]
  assert walls == sorted(walls) and len(rows) == 6
  first_session = walls[2]  # step 3, the first session's last row
  assert resumed["summary"]["wall_time_s"] > first_session > 0


def test_sigkill_during_a_save_restarts_from_the_last_complete_checkpoint(
    tmp_path, data_dir, uninterrupted):
  reference_dir, reference = uninterrupted
  sets = ["train.steps=6", "train.checkpoint_every=2"]
  killed = run(tmp_path, data_dir, "--kill_during_save_of_step", "4", sets=sets, check=False)
  assert killed.returncode == -9
  assert checkpoint.make_manager(str(tmp_path)).latest_step() == 2
  assert any("tmp" in name for name in os.listdir(tmp_path / "checkpoints"))

  resumed = run(tmp_path, data_dir, sets=sets)
  assert resumed["losses"] == reference["losses"]
  for a, b in zip(params_of(tmp_path), params_of(reference_dir)):
    np.testing.assert_array_equal(a, b)


def test_cpu_split_into_per_core_devices_trains_the_same_model(tmp_path, data_dir,
                                                               uninterrupted):
  _, reference = uninterrupted
  split = run(tmp_path, data_dir, "--cpu_devices", "0",
              sets=["train.steps=6", "train.checkpoint_every=2"])
  cores = len(os.sched_getaffinity(0))
  assert split["devices"] == sharding.cpu_device_count((-1, 1, 1), 8, 1, cores)
  assert reference["devices"] == 1
  # Data-parallel devices sum the gradient in a different order: equal to rounding.
  steps = sorted(reference["losses"])
  np.testing.assert_allclose([split["losses"][s] for s in steps],
                             [reference["losses"][s] for s in steps], rtol=1e-5)


def test_hashing_a_saved_checkpoint_stays_out_of_the_step_time(tmp_path, data_dir,
                                                               monkeypatch):
  """The sha256 record of a background save is written on the training thread; like the save,
  it is left out of step_time_s (it took 1.5 s / 4 steps = 375 ms a step in one window)."""
  import time
  from transformer.training import checkpoint_integrity
  record = checkpoint_integrity.record
  monkeypatch.setattr(checkpoint_integrity, "record",
                      lambda *a, **k: (time.sleep(1.5), record(*a, **k))[1])
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 60, "train.log_every": 4,
                                             "train.checkpoint_every": 30,
                                             "train.eval_every": 100})
  loop.train_and_evaluate(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  times = [r["step_time_s"] for r in rows if "step_time_s" in r]
  assert len(times) >= 5 and max(times[1:]) < 0.25, times  # the first holds the compile


def test_every_seed_is_evaluated_on_the_same_tokens(data_dir):
  """The eval windows follow train.eval_seed, not train.seed: seeds compare on one eval set."""
  config = tiny_run.tiny_config(data_dir, **{"train.eval_batches": 2})
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size)
  built = loop.build(config, mesh)
  tokenizer = data.get_tokenizer(config.data, None)
  with sharding.activate(mesh):
    params = jax.jit(built.init)(0)["params"]
    def scored(**keys):
      c = tiny_run.tiny_config(data_dir, **{"train.eval_batches": 2, **keys})
      return loop.evaluate(built.eval_step, params, c, tokenizer, mesh)
    assert scored(**{"train.seed": 0}) == scored(**{"train.seed": 7})
    # ... and the windows do move with eval_seed, so the equality above is not vacuous
    assert scored(**{"train.eval_seed": 0}) != scored(**{"train.eval_seed": 7})


def test_incompatible_checkpoint_is_refused_and_nothing_is_overwritten(tmp_path, data_dir):
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 1}), str(tmp_path))
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  wider = tiny_run.tiny_config(data_dir, **{"train.steps": 2, "model.d_model": 128})
  with pytest.raises(ValueError, match=r"different model \(model.d_model: 64 saved vs 128 now"):
    loop.train_and_evaluate(wider, str(tmp_path))
  # Another tokenizer is refused before it is trained into the workdir.
  retokenized = tiny_run.tiny_config(data_dir, **{"data.tokenizer": "sentencepiece",
                                                  "data.vocab_size": 256})
  with pytest.raises(ValueError, match=r"different data stream \(data.tokenizer: 'bytes' "):
    loop.train_and_evaluate(retokenized, str(tmp_path))
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
  assert checkpoint.make_manager(str(tmp_path)).all_steps() == [1]


def test_a_finished_run_is_not_its_own_source_nor_rerun_with_other_settings(tmp_path, data_dir):
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 1}), str(tmp_path))
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  # Fine-tuning into the source's own workdir would resume it and prune its checkpoints.
  into_itself = tiny_run.tiny_config(data_dir, **{"train.steps": 4,
                                                  "train.init_from": str(tmp_path)})
  with pytest.raises(ValueError, match=r"is this run's --workdir .*; pick a new --workdir"):
    loop.train_and_evaluate(into_itself, str(tmp_path))
  # "Nothing to do" would silently drop the new learning rate.
  other_lr = tiny_run.tiny_config(data_dir, **{"train.steps": 1, "opt.lr": 0.5})
  with pytest.raises(ValueError, match=r"is a finished run of other settings \(opt.lr: 0.01 "
                                       r"saved vs 0.5 now\); use a new --workdir"):
    loop.train_and_evaluate(other_lr, str(tmp_path))
  relogged = tiny_run.tiny_config(data_dir, **{"train.steps": 1, "train.log_every": 5})
  assert loop.train_and_evaluate(relogged, str(tmp_path))["step"] == 1  # nothing to do
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_checkpoint_that_does_not_restore_names_the_settings_and_writes_nothing(
    tmp_path, data_dir):
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 1}), str(tmp_path))
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  other_opt = tiny_run.tiny_config(data_dir, **{"train.steps": 2, "opt.name": "sgd"})
  with pytest.raises(ValueError, match=r"step-1 checkpoint does not restore into this config "
                                       r"\(opt.name: 'adamw' saved vs 'sgd' now\); use a new"):
    loop.train_and_evaluate(other_opt, str(tmp_path))
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_gradient_accumulation_matches_the_full_batch(tmp_path, data_dir):
  full = loop.train_and_evaluate(
      tiny_run.tiny_config(data_dir, **{"train.steps": 2}), str(tmp_path / "full"))
  accum = loop.train_and_evaluate(
      tiny_run.tiny_config(data_dir, **{"train.steps": 2, "opt.grad_accum_steps": 4}),
      str(tmp_path / "accum"))
  a, b = tiny_run.losses(str(tmp_path / "full")), tiny_run.losses(str(tmp_path / "accum"))
  np.testing.assert_allclose([a[1], a[2]], [b[1], b[2]], rtol=1e-5)
  assert full["final_eval_loss"] == pytest.approx(accum["final_eval_loss"], rel=1e-5)


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
  config = tiny_run.tiny_config(data_dir, **{
      "train.steps": 6, "train.checkpoint_every": 1, "opt.schedule": "linear",
      "opt.clip_norm": 0.0, "opt.name": "sgd", "opt.momentum": 0.0, "opt.warmup_steps": 0})
  config.opt.lr = 1e30  # the first update overflows the weights
  with pytest.raises(FloatingPointError, match="not finite at step 2"):
    loop.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.make_manager(str(tmp_path)).all_steps() == [1]


@pytest.mark.parametrize("family", ["mlm", "seq2seq"])
def test_other_families_train(tmp_path, data_dir, family):
  config = tiny_run.tiny_config(data_dir, family, **{"train.steps": 8})
  if family == "seq2seq":
    config.data.update(dict(max_length=8, seq_len=16))
  loop.train_and_evaluate(config, str(tmp_path))
  rows = tiny_run.losses(str(tmp_path))
  assert rows[8] < rows[1]


@pytest.mark.parametrize("overrides,message", [
    ({"data.name": "no_such_data"}, "unknown dataset .no_such_data.: built-in datasets are"),
    ({"data.tokenizer": "wordpiece"}, "unknown tokenizer 'wordpiece'; valid: "),
    ({"opt.grad_accum_steps": 3}, "train.batch_size=8 is not divisible by "
                                  "opt.grad_accum_steps=3"),
    ({"model.position.name": "learned", "data.seq_len": 100},
     "data.seq_len=100 exceeds what model.position.name='learned' allows"),
    ({"opt.name": "adam"}, "unknown opt.name 'adam'; valid: "),
    # Before the first evaluation, which would have come after the compile and some training.
    ({"train.eval_split": "valid"}, "train.eval_split='valid': dataset 'grammar_corpus' has no "
                                    "split 'valid'; its splits are"),
    ({"mesh.shape": (0, 1, 1)}, r"mesh.shape \(0, 1, 1\): sizes must be positive"),
])
def test_bad_input_is_one_clear_error_before_compute(tmp_path, data_dir, overrides, message):
  with pytest.raises(ValueError, match=message):
    loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **overrides), str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")


def test_unwritable_workdir(tmp_path, data_dir):
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(ValueError, match="cannot write to --workdir"):
    loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(blocker / "run"))


def test_command_line_is_locked_and_errors_are_one_line(tmp_path):
  base = [sys.executable, "-m", "transformer.train", "--config", "configs/lm.py:size=xs",
          "--workdir", str(tmp_path)]
  typo = subprocess.run(base + ["--config.train.stepz=3"], capture_output=True, text=True,
                        cwd=ROOT, timeout=300)
  assert typo.returncode == 1
  assert typo.stderr.strip().splitlines() == [
      "error: unknown config key 'stepz'; Did you mean \"steps\" instead of \"stepz\"?"]
  missing = subprocess.run(base[:4] + ["configs/nope.py"] + base[5:], capture_output=True,
                           text=True, cwd=ROOT, timeout=300)
  assert missing.returncode == 1
  assert missing.stderr.strip().splitlines()[-1] == (
      "error: cannot load --config: [Errno 2] No such file or directory: 'configs/nope.py'")
  bad = subprocess.run(base + ["--config.data.tokenizer=nope"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
  assert bad.returncode == 1
  assert bad.stderr.strip().splitlines()[-1].startswith("error: unknown tokenizer 'nope'")

  devices = subprocess.run(base + ["--cpu_devices=-1"], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
  assert devices.returncode != 0
  assert devices.stderr.strip().splitlines()[-1].endswith("use 0 (one per core) or a count")
