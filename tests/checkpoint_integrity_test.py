"""Damaged checkpoints (issue 23): each kind of damage is named in one line, the step is moved
aside (not deleted) and the run resumes from the newest intact step."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from helpers import tiny_run
from helpers.damage import biggest, flip
from transformer.training import checkpoint, checkpoint_integrity, loop


def _truncate(step_dir):
  path = biggest(os.path.join(step_dir, "params"))
  with open(path, "r+b") as f:
    f.truncate(1000)


def _delete(step_dir):
  os.remove(biggest(os.path.join(step_dir, "train_state")))


DAMAGE = {  # name: (what to do to step 4, the step it names, the words that say why)
    "truncated": (_truncate, 4, r"params/.* has 1000 bytes, \d+ when saved"),
    "deleted": (_delete, 4, r"train_state/.* is missing"),
    "flipped": (flip, 4, r"params/.* changed since it was saved \(sha256 mismatch\)"),
    "empty step folder": (lambda d: os.makedirs(d.replace("/4", "/6")), 6,
                          r"an empty or stray step folder"),
    "partial step folder": (lambda d: shutil.copytree(os.path.join(d, "params"),
                                                      d.replace("/4", "/6") + "/params"),
                            6, r"no train_state/, data/, meta/ in it"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
  """A 4-step tiny run with checkpoints at steps 2 and 4 (sha256 records written)."""
  workdir = tmp_path_factory.mktemp("trained") / "run"
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 4, "train.checkpoint_every": 2})
  loop.train_and_evaluate(config, str(workdir))
  return workdir, config


def test_every_complete_step_has_a_record_that_matches(trained):
  workdir, _ = trained
  steps = checkpoint_integrity.step_dirs(str(workdir / "checkpoints"))
  assert sorted(steps) == [2, 4]
  for step_dir in steps.values():
    sums = json.load(open(os.path.join(step_dir, checkpoint_integrity.SUMS)))["files"]
    assert any(name.startswith("params/") for name in sums)
    assert checkpoint_integrity.problem(step_dir) is None


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_named_and_set_aside(tmp_path, trained, kind):
  workdir, _ = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  damage, step, why = DAMAGE[kind]
  damage(str(copy / "checkpoints" / "4"))
  lines = []
  assert checkpoint_integrity.set_aside_damaged(str(copy), lines.append) == [step]
  assert len(lines) == 1
  assert lines[0].startswith(f"checkpoint step {step} in {copy}/checkpoints is damaged (")
  assert re.search(why, lines[0]), lines[0]
  resumed_from = 2 if step == 4 else 4
  assert lines[0].endswith(f"moved it to {copy}/checkpoints_damaged/{step}; resuming from "
                           f"step {resumed_from}")
  assert os.path.isdir(copy / "checkpoints_damaged" / str(step))  # kept, not deleted
  assert sorted(checkpoint_integrity.step_dirs(str(copy / "checkpoints"))) == (
      [2] if step == 4 else [2, 4])


def _unrecorded(workdir, tmp_path):
  """A copy of the run whose step 4 lost its record, as a kill between orbax's rename and
  the record leaves it."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  os.remove(copy / "checkpoints" / "4" / checkpoint_integrity.SUMS)
  return copy


def test_a_step_without_record_is_read_back_and_then_recorded(tmp_path, trained):
  copy = _unrecorded(trained[0], tmp_path)
  lines = []
  assert checkpoint_integrity.set_aside_damaged(str(copy), lines.append) == [] and not lines
  assert checkpoint_integrity.problem(str(copy / "checkpoints" / "4")) is None
  assert os.path.exists(copy / "checkpoints" / "4" / checkpoint_integrity.SUMS)


@pytest.mark.parametrize("kind", ["truncated", "deleted"])
def test_a_damaged_step_without_record_is_named_and_set_aside(tmp_path, trained, kind):
  """(Flipped bits inside orbax's zstd-compressed chunks mostly decode to finite numbers:
  without a record they are not seen, as the module says.)"""
  copy = _unrecorded(trained[0], tmp_path)
  DAMAGE[kind][0](str(copy / "checkpoints" / "4"))
  lines = []
  assert checkpoint_integrity.set_aside_damaged(str(copy), lines.append) == [4]
  assert re.match(rf"checkpoint step 4 in {copy}/checkpoints is damaged \(it does not read back: "
                  r".+\); moved it to .*; resuming from "
                  r"step 2$", lines[0]), lines[0]
  assert len(lines) == 1 and os.path.isdir(copy / "checkpoints_damaged" / "4")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_unrecorded_step_with_non_finite_numbers_is_damaged(tmp_path, data_dir, bad):
  """Flipped exponent bits give inf as well as NaN: both fail the read-back."""
  config = tiny_run.tiny_config(data_dir)
  manager = checkpoint.make_manager(str(tmp_path))
  state = {"params": {"w": np.array([1.0, bad], np.float32)}, "step": np.int32(3)}
  checkpoint.save(manager, 3, state, {}, config)
  manager.wait_until_finished()  # not checkpoint.finish: it would record the sums
  manager.close()
  assert checkpoint_integrity.unreadable(str(tmp_path / "checkpoints" / "3")) == (
      "params/ holds NaN or inf values")


def test_a_multi_process_run_does_not_read_an_unrecorded_step_back(tmp_path, trained):
  copy = _unrecorded(trained[0], tmp_path)
  _truncate(str(copy / "checkpoints" / "4"))
  assert checkpoint_integrity.set_aside_damaged(str(copy), single_process=False) == []
  assert not os.path.exists(copy / "checkpoints" / "4" / checkpoint_integrity.SUMS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flipped", "empty step folder"])
def test_a_run_resumes_from_the_newest_intact_checkpoint(tmp_path, trained, kind, capsys):
  workdir, config = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  damage, step, _ = DAMAGE[kind]
  damage(str(copy / "checkpoints" / "4"))
  config = tiny_run.tiny_config(config.data.data_dir, **{"train.steps": 6,
                                                         "train.checkpoint_every": 2})
  summary = loop.train_and_evaluate(config, str(copy))
  out = capsys.readouterr().out
  assert f"checkpoint step {step} in {copy}/checkpoints is damaged" in out
  assert f"resumed from step {2 if step == 4 else 4} in" in out
  assert summary["step"] == 6
  assert sorted(tiny_run.losses(str(copy))) == [1, 2, 3, 4, 5, 6]  # no step twice, none lost
  assert os.listdir(copy / "checkpoints_damaged") == [str(step)]


def test_two_damaged_steps_of_the_same_number_are_both_kept(tmp_path, trained):
  workdir, _ = trained
  for attempt in range(2):
    copy = tmp_path / "run"
    if copy.exists():
      shutil.rmtree(copy / "checkpoints")
      shutil.copytree(workdir / "checkpoints", copy / "checkpoints")
    else:
      shutil.copytree(workdir, copy)
    flip(str(copy / "checkpoints" / "4"))
    checkpoint_integrity.set_aside_damaged(str(copy), lambda line: None)
  assert sorted(os.listdir(copy / "checkpoints_damaged")) == ["4", "4.1"]


def test_generate_refuses_a_damaged_step_in_one_line(tmp_path, trained):
  workdir, _ = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  flip(str(copy / "checkpoints" / "4"))
  with pytest.raises(ValueError, match=r"the step-4 checkpoint in .* is damaged \(params/"):
    checkpoint.load_for_inference(str(copy))
  checkpoint.load_for_inference(str(copy), step=2)  # the intact one still loads


def test_generate_reads_an_unrecorded_step_back_before_loading_it(tmp_path, trained):
  copy = _unrecorded(trained[0], tmp_path)  # stopped between the save and its record
  _truncate(str(copy / "checkpoints" / "4"))
  with pytest.raises(ValueError, match=r"the step-4 checkpoint in .* is damaged \(it does not "
                                       r"read back: .*\); pass --step with another of \[2, 4\]"):
    checkpoint.load_for_inference(str(copy))


def test_the_nan_guard_names_the_newest_intact_step(tmp_path, trained):
  workdir, _ = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  flip(str(copy / "checkpoints" / "4"))  # damaged after it was saved, during the run
  manager = checkpoint.make_manager(str(copy))
  error = loop._non_finite(7, {"loss": float("nan"), "grad_norm": float("nan")}, manager)
  manager.close()
  assert f"the newest intact checkpoint is step 2 in {copy}/checkpoints" in str(error)


@pytest.mark.slow
def test_a_finished_run_whose_final_step_is_damaged_trains_it_again(tmp_path, trained, capsys):
  workdir, config = trained  # summary.json says step 4; step 4 is set aside on the re-run
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  flip(str(copy / "checkpoints" / "4"))
  assert loop.train_and_evaluate(config, str(copy))["step"] == 4
  assert "resumed from step 2 in" in capsys.readouterr().out
  assert sorted(os.listdir(copy / "checkpoints")) == ["2", "4"]


def test_a_failed_final_save_leaves_the_run_unfinished(tmp_path, data_dir, monkeypatch):
  real = checkpoint.finish

  def finish(manager):  # the step-2 (final) save fails once written
    real(manager)
    if 2 in manager.all_steps():
      raise RuntimeError("the save failed")

  monkeypatch.setattr(checkpoint, "finish", finish)
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 2, "train.checkpoint_every": 2})
  with pytest.raises(RuntimeError, match="the save failed"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "summary.json")  # a re-run resumes


@pytest.mark.slow
def test_a_finished_run_without_checkpoints_is_refused_not_trained_over(tmp_path, trained):
  workdir, config = trained
  for damage in ("deleted", "damaged"):  # records restored, space freed; or set aside
    copy = tmp_path / damage
    shutil.copytree(workdir, copy)
    if damage == "deleted":
      shutil.rmtree(copy / "checkpoints")
    else:
      shutil.rmtree(copy / "checkpoints" / "2")
      flip(str(copy / "checkpoints" / "4"))
    logs = {p: (copy / p).read_bytes() for p in ("metrics.jsonl", "summary.json")}
    with pytest.raises(ValueError, match=r"holds a finished run \(summary.json, step 4\) but no "
                                         r"checkpoint to resume from; .* use a new --workdir"):
      loop.train_and_evaluate(config, str(copy))
    assert {p: (copy / p).read_bytes() for p in logs} == logs


def test_the_trainer_reads_an_unrecorded_step_back_when_it_runs_alone(tmp_path, trained):
  """checkpoint.set_aside_damaged (what the loop calls) reads a step without a record back in a
  single-process run: a truncated one is set aside, not resumed from."""
  copy = _unrecorded(trained[0], tmp_path)
  _truncate(copy / "checkpoints" / "4")
  lines = []
  assert checkpoint.set_aside_damaged(str(copy), lines.append) == [4]
  assert "it does not read back" in lines[0]


def test_every_damaged_copy_of_a_step_is_kept_under_its_own_name(tmp_path, trained):
  """A step damaged again after a resume (three times here) gets 4, 4.1, 4.2: none replaced."""
  workdir, _ = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  for _ in range(3):
    shutil.rmtree(copy / "checkpoints")
    shutil.copytree(workdir / "checkpoints", copy / "checkpoints")
    flip(str(copy / "checkpoints" / "4"))
    assert checkpoint_integrity.set_aside_damaged(str(copy), lambda line: None) == [4]
  assert sorted(os.listdir(copy / "checkpoints_damaged")) == ["4", "4.1", "4.2"]


@pytest.mark.parametrize("sums", [{"files": {"params/x": [1]}}, {"files": []},
                                  {"files": {"params/x": None}}])
def test_a_malformed_record_is_damage_not_a_crash(tmp_path, sums):
  """A sha256sums.json that parses but is not a record names the step as damaged (so that it
  is set aside), like one that does not parse, instead of raising out of the trainer."""
  for item in checkpoint_integrity.ITEMS:
    os.makedirs(tmp_path / item)
  (tmp_path / checkpoint_integrity.SUMS).write_text(json.dumps(sums))
  assert checkpoint_integrity.problem(str(tmp_path)) == (
      f"its {checkpoint_integrity.SUMS} is unreadable")
