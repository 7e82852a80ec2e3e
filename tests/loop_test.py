"""transformer/training/loop.py and step.py through the trainer: which step a NaN stops at,
which rows carry eval numbers, what a resumed log counts, a re-run of a finished run, and a
step's randomness, loss and learning rate (train_test.py has the command-line runs)."""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import tiny_run
from transformer import data
from transformer.data.shards import ShardedBatches
from transformer.training import checkpoint, loop, optim, sharding

pytestmark = pytest.mark.slow  # end-to-end runs (conftest.py)


def _rows(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_a_non_finite_step_between_saves_stops_the_run_at_the_next_step(tmp_path, data_dir):
  """The NaN guard does not wait for a save or an eval: a step whose loss is not finite stops
  the run one step later, naming that step (not the next save's)."""
  config = tiny_run.tiny_config(data_dir, **{
      "train.steps": 6, "train.checkpoint_every": 1000, "opt.schedule": "linear",
      "opt.clip_norm": 0.0, "opt.name": "sgd", "opt.momentum": 0.0, "opt.warmup_steps": 0})
  config.opt.lr = 1e30  # the first update overflows the weights
  with pytest.raises(FloatingPointError, match=r"not finite at step 2; stopping \(no intact "):
    loop.train_and_evaluate(config, str(tmp_path))


def test_eval_rows_and_checkpoint_metrics_belong_to_their_own_step(tmp_path, data_dir,
                                                                   monkeypatch):
  """An eval logs a row at its step even off the log cadence, its numbers appear in that row
  only, the final step is always evaluated, and a save with no eval at its step carries no
  eval loss (keep_best would rank it by an older step's)."""
  saves, real = [], checkpoint.save

  def save(manager, step, *args, eval_loss=None, **kwargs):
    saves.append((step, eval_loss))
    return real(manager, step, *args, eval_loss=eval_loss, **kwargs)
  monkeypatch.setattr(checkpoint, "save", save)
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 5, "train.log_every": 2,
                                             "train.eval_every": 3, "train.checkpoint_every": 2})
  summary = loop.train_and_evaluate(config, str(tmp_path))
  rows = _rows(tmp_path)
  assert [(r["step"], "eval_loss" in r) for r in rows] == [
      (2, False), (3, True), (4, False), (5, True)]
  assert [(step, loss is not None) for step, loss in saves] == [(2, False), (4, False), (5, True)]
  assert saves[-1][1] == pytest.approx(rows[-1]["eval_loss"])
  assert summary["final_eval_loss"] == pytest.approx(rows[-1]["eval_loss"])


def test_a_resumed_run_counts_tokens_and_wall_time_from_the_start(tmp_path, data_dir):
  """Rows after a resume go on from the restored step: tokens count every step since step 0,
  wall_time_s adds the earlier sessions' (the last kept row's), and the session's first row
  carries its compile time."""
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 2}), str(tmp_path))
  rows = _rows(tmp_path)
  rows[-1]["wall_time_s"] = 1e6  # a long first session, so that the sum is unmistakable
  rows[0]["wall_time_s"] = 5.0
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  summary = loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 4}),
                                    str(tmp_path))
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  assert [r["tokens"] for r in rows] == [step * 8 * 32 for step in (1, 2, 3, 4)]
  assert 1e6 < rows[2]["wall_time_s"] < rows[3]["wall_time_s"] < 1e6 + 600
  assert summary["wall_time_s"] >= rows[3]["wall_time_s"]
  assert "compile_time_s" in rows[2] and "compile_time_s" not in rows[3]


def test_a_run_stopped_between_its_final_save_and_its_summary_finishes_on_rerun(tmp_path,
                                                                                 data_dir):
  """The final checkpoint saved but summary.json missing (killed in between) or still an
  earlier session's: the re-run trains nothing, evaluates the final step, writes its summary."""
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 2}), str(tmp_path))
  earlier = (tmp_path / "summary.json").read_text()
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 3})
  done = loop.train_and_evaluate(config, str(tmp_path))
  (tmp_path / "summary.json").write_text(earlier)  # step 2's: step 3's was never written
  again = loop.train_and_evaluate(config, str(tmp_path))
  assert again["step"] == 3
  assert again["final_eval_loss"] == pytest.approx(done["final_eval_loss"])
  assert json.load(open(tmp_path / "summary.json"))["step"] == 3
  os.remove(tmp_path / "summary.json")  # no summary at all
  assert loop.train_and_evaluate(config, str(tmp_path))["final_eval_loss"] == pytest.approx(
      done["final_eval_loss"])
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]


def test_the_initial_parameters_follow_train_seed(tmp_path, data_dir):
  """train.seed draws the initial parameters: with lr 0 a run saves exactly built.init(seed)'s,
  (to rounding), so two seeds are two models."""
  saved = {}
  for seed in (0, 1):
    config = tiny_run.tiny_config(data_dir, **{"train.steps": 1, "train.seed": seed})
    config.opt.lr = 0.0
    loop.train_and_evaluate(config, str(tmp_path / str(seed)))
    _, _, params, _ = checkpoint.load_for_inference(str(tmp_path / str(seed)))
    saved[seed] = jax.tree.leaves(jax.device_get(params))
    built = loop.build(config, sharding.make_mesh(config.mesh.shape, config.train.batch_size))
    for a, b in zip(saved[seed], jax.tree.leaves(jax.device_get(jax.jit(built.init)(seed)["params"]))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # lr 0: unchanged, to rounding
  assert any(not np.array_equal(a, b) for a, b in zip(saved[0], saved[1]))


def _one_batch_setup(data_dir, **overrides):
  config = tiny_run.tiny_config(data_dir, **overrides)
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size)
  built = loop.build(config, mesh)
  tokenizer = data.get_tokenizer(config.data, None)
  batch = next(ShardedBatches(config, tokenizer, split=config.train.train_split,
                              objective=config.objective.name, seed=config.train.seed,
                              num_shards=config.train.data_shards))
  return config, mesh, built, tokenizer, batch


def test_evaluation_scores_train_eval_batches_batches(data_dir):
  """evaluate() reads train.eval_batches batches: two batches score other tokens than one."""
  config, mesh, built, tokenizer, _ = _one_batch_setup(data_dir)
  with sharding.activate(mesh):
    params = jax.jit(built.init)(0)["params"]
    scores = [loop.evaluate(built.eval_step, params, tiny_run.tiny_config(
        data_dir, **{"train.eval_batches": n}), tokenizer, mesh) for n in (1, 2)]
  assert scores[0]["eval_loss"] != scores[1]["eval_loss"]


def test_each_step_draws_its_own_dropout_masks(data_dir):
  """Step k's randomness is fold_in(rng, k): the same parameters and batch at another step
  drop other units (and at the same step, the same ones: a resume is exact)."""
  config, mesh, built, _, batch = _one_batch_setup(data_dir, **{"model.dropout_rate": 0.5})
  with sharding.activate(mesh):
    def loss_at(step):
      state = jax.jit(built.init, out_shardings=built.state_shardings)(0)
      state["step"] = jax.device_put(jnp.int32(step), built.state_shardings["step"])
      _, metrics = built.train_step(state, sharding.global_batch(batch, mesh))
      return float(metrics["loss"])
    assert loss_at(3) == loss_at(3)
    assert loss_at(3) != loss_at(4)


def test_a_step_reports_the_mean_loss_its_gradient_and_the_rate_it_applied(data_dir):
  """loss and grad_norm are per real token (sums divided once), and learning_rate is the rate
  of this update: schedule(k - 1) for step k, as optax counts from 0."""
  config, mesh, built, _, batch = _one_batch_setup(data_dir, **{"opt.warmup_steps": 3})
  schedule = optim.make_schedule(config.opt, config.train.steps)
  with sharding.activate(mesh):
    state = jax.jit(built.init, out_shardings=built.state_shardings)(0)
    global_batch = sharding.global_batch(batch, mesh)
    (loss_sum, sums), grads = jax.value_and_grad(built.loss_fn, has_aux=True)(
        state["params"], global_batch, jax.random.key(0), False)
    rates = []
    for _ in range(2):
      state, metrics = built.train_step(state, global_batch)
      rates.append(float(metrics["learning_rate"]))
      if len(rates) == 1:
        first = jax.device_get(metrics)
  count = float(sums["weight_sum"])
  assert float(first["loss"]) == pytest.approx(float(loss_sum) / count, rel=1e-5)
  assert float(first["grad_norm"]) == pytest.approx(float(optax.tree.norm(grads)) / count,
                                                    rel=1e-4)
  assert rates == pytest.approx([float(schedule(0)), float(schedule(1))])
  assert float(schedule(0)) != float(schedule(1))


def test_a_failing_checkpoint_close_does_not_hide_the_error_that_stopped_the_run(
    tmp_path, data_dir, monkeypatch):
  """While an error propagates, the checkpoint manager's own failure on close is dropped: the
  user sees what stopped the run, not the noise it left behind."""
  def fail(*args, **kwargs):
    raise ValueError("not today")

  def finish(manager):
    raise RuntimeError("the save failed too")
  monkeypatch.setattr(loop.ShardedBatches, "__next__", fail)
  monkeypatch.setattr(checkpoint, "finish", finish)
  with pytest.raises(ValueError, match="not today"):
    loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(tmp_path / "run"))


def test_evaluate_turns_the_eval_sums_into_loss_perplexity_accuracy_and_bits_per_byte(data_dir):
  """evaluate(): loss = nll/weight (nats per token), perplexity = exp(loss), accuracy =
  correct/weight, bits per byte = nll/bytes/ln 2, over the eval_seed's first eval_batches."""
  config, mesh, built, tokenizer, _ = _one_batch_setup(data_dir, **{"train.eval_batches": 2})
  batches = ShardedBatches(config, tokenizer, split=config.train.eval_split,
                           objective=config.objective.name, seed=config.train.eval_seed,
                           num_shards=config.train.data_shards)
  with sharding.activate(mesh):
    params = jax.jit(built.init)(0)["params"]
    got = loop.evaluate(built.eval_step, params, config, tokenizer, mesh)
    sums = [jax.device_get(built.eval_step(params, sharding.global_batch(next(batches), mesh),
                                           data.token_bytes(tokenizer))) for _ in range(2)]
  total = {k: float(sum(s[k] for s in sums)) for k in sums[0]}
  loss = total["nll_sum"] / total["weight_sum"]
  assert got["eval_loss"] == pytest.approx(loss, rel=1e-6)
  assert got["eval_perplexity"] == pytest.approx(np.exp(loss), rel=1e-6)
  assert got["eval_accuracy"] == pytest.approx(total["correct_sum"] / total["weight_sum"], rel=1e-6)
  assert got["eval_bpb"] == pytest.approx(total["nll_sum"] / total["byte_sum"] / np.log(2),
                                          rel=1e-6)


def test_a_stop_at_a_non_finite_step_saves_no_checkpoint_of_it(tmp_path, data_dir, monkeypatch):
  """SIGTERM at a step whose loss is not finite stops with the NaN error, not with a saved
  checkpoint of NaN parameters that the re-run would resume from."""
  config = tiny_run.tiny_config(data_dir, **{
      "train.steps": 6, "train.checkpoint_every": 1000, "opt.schedule": "linear",
      "opt.clip_norm": 0.0, "opt.name": "sgd", "opt.momentum": 0.0, "opt.warmup_steps": 0})
  config.opt.lr = 1e30  # step 1 overflows the weights: step 2's loss is not finite
  calls, original = {"n": 0}, ShardedBatches.__next__

  def next_then_signal(self):
    if self.split == config.train.train_split:
      calls["n"] += 1
      if calls["n"] == 2:  # while fetching step 2's batch: the loop stops after step 2
        os.kill(os.getpid(), signal.SIGTERM)
    return original(self)
  monkeypatch.setattr(ShardedBatches, "__next__", next_then_signal)
  with pytest.raises(FloatingPointError, match="not finite at step 2"):
    loop.train_and_evaluate(config, str(tmp_path))
  assert checkpoint.make_manager(str(tmp_path)).all_steps() == []


def test_a_summary_that_is_not_an_object_is_trained_again_not_a_crash(tmp_path, data_dir):
  """_finished_summary treats a summary.json that is valid JSON but not an object as
  unreadable (as run_log.check_fresh_start does): the run evaluates again, no traceback."""
  (tmp_path / "summary.json").write_text("[3]")
  config = tiny_run.tiny_config(data_dir)
  assert loop._finished_summary(config, str(tmp_path), config.train.steps) is None


def test_an_empty_eval_slice_is_refused_before_training(tmp_path, data_dir):
  """train.eval_split names a split but a slice with no records ("validation[:0]"): one line
  before the first step, not TFDS's words at the first evaluation."""
  config = tiny_run.tiny_config(data_dir, **{"train.eval_split": "validation[:0]"})
  with pytest.raises(ValueError, match=r"^split 'validation\[:0\]' of dataset .* is empty: "):
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
