"""The optional W&B writer, offline (WANDB_MODE=offline, no network): the offline run holds
what was logged, a resumed run continues the same W&B run, and a missing wandb package is one
line naming the install command."""

import os
import sys

import ml_collections
import pytest

from helpers import tiny_run, wandb_records
from transformer.training import loop, run_log, wandb_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """W&B in offline mode with every file it writes under tmp_path/wandb_home."""
  home = tmp_path / "wandb_home"
  for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
    monkeypatch.setenv(name, str(home))
  monkeypatch.setenv("WANDB_MODE", "offline")
  home.mkdir()
  return str(home)


def test_missing_wandb_is_one_line_with_the_install_command(monkeypatch):
  wandb_log.check_config("")  # off: wandb is not needed
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
  with pytest.raises(ValueError) as e:
    wandb_log.check_config("my-project")
  assert "pip install -e '.[wandb]'" in str(e.value) and "\n" not in str(e.value)


def test_offline_run_gets_the_history_and_a_resume_reuses_the_id(tmp_path, offline):
  workdir = tmp_path / "run"
  workdir.mkdir()
  log = run_log.RunLog(str(workdir), total_steps=5, enabled=True, wandb_project="tests")
  log.write_config(ml_collections.ConfigDict({"opt": {"lr": 0.01}}))
  for step in (1, 2, 3):
    log.metrics(step, {"loss": 4.0 - step, "note": "not a number"})
  log.close()
  stored = open(workdir / wandb_log.ID_FILE).read().split()[0]

  log = run_log.RunLog(str(workdir), total_steps=5, enabled=True, start_step=3,
                       wandb_project="tests")
  log.write_config(ml_collections.ConfigDict({"opt": {"lr": 0.02}}))
  for step in (4, 5):
    log.metrics(step, {"loss": 4.0 - step})
  log.summary({"final_eval_loss": 0.5, "step": 5, "config": {"opt.lr": 0.02}})
  log.close()

  first, second = wandb_records.offline_runs(offline)
  assert first["id"] == second["id"] == stored and len(stored) == 8
  assert [(r["_step"], r["loss"]) for r in first["history"]] == [(1, 3.0), (2, 2.0), (3, 1.0)]
  assert [(r["_step"], r["loss"]) for r in second["history"]] == [(4, 0.0), (5, -1.0)]
  assert "note" not in first["history"][0]  # only numbers are charted
  assert first["config"]["opt.lr"] == 0.01 and second["config"]["opt.lr"] == 0.02
  assert second["summary"]["final_eval_loss"] == 0.5


@pytest.mark.slow
def test_train_command_logs_to_wandb_and_its_resume_continues_the_run(tmp_path, data_dir,
                                                                      offline):
  workdir = str(tmp_path / "run")
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 3, "log.wandb_project": "tests"})
  loop.train_and_evaluate(config, workdir)
  config.train.steps = 5  # the same run, trained further: a resume
  summary = loop.train_and_evaluate(config, workdir)
  first, second = wandb_records.offline_runs(offline)
  stored = open(os.path.join(workdir, wandb_log.ID_FILE)).read().split()[0]
  assert first["id"] == second["id"] == stored
  losses = tiny_run.losses(workdir)
  logged = {r["_step"]: r["loss"] for run in (first, second) for r in run["history"]}
  assert logged == pytest.approx(losses) and sorted(logged) == [1, 2, 3, 4, 5]
  assert first["config"]["model.d_model"] == 64
  assert second["summary"]["final_eval_loss"] == pytest.approx(summary["final_eval_loss"])


def test_a_moved_workdir_keeps_its_run_and_a_copy_gets_a_new_one(tmp_path):
  """`cp -r run branch` then training the branch must not log into the original's W&B run
  (each would overwrite the other's steps); `mv run elsewhere` continues it."""
  import shutil
  original = tmp_path / "run"
  original.mkdir()
  first = wandb_log.run_id(str(original))
  assert wandb_log.run_id(str(original)) == first  # a resume

  shutil.copytree(original, tmp_path / "branch")
  branch = wandb_log.run_id(str(tmp_path / "branch"))
  assert branch != first and len(branch) == 8
  assert wandb_log.run_id(str(tmp_path / "branch")) == branch  # the branch's resume
  assert wandb_log.run_id(str(original)) == first  # the original is untouched

  shutil.move(str(original), str(tmp_path / "moved"))
  assert wandb_log.run_id(str(tmp_path / "moved")) == first
  assert wandb_log.run_id(str(tmp_path / "moved")) == first  # and its path is updated

  # A file from before the path was kept: the id is kept, the path recorded from now on.
  old = tmp_path / "old"
  old.mkdir()
  (old / wandb_log.ID_FILE).write_text("abcd1234\n")
  assert wandb_log.run_id(str(old)) == "abcd1234"
  assert (old / wandb_log.ID_FILE).read_text() == f"abcd1234\n{old}\n"


def test_wandb_without_a_login_is_one_line_saying_how_to_log_in(tmp_path):
  """Online mode with no API key anywhere: W&B's UsageError becomes the train command's
  one-line error (a ValueError), naming the ways out. A subprocess: W&B keeps the settings
  of its first start (the offline tests') for the life of a process."""
  import subprocess
  home = tmp_path / "home"
  home.mkdir()
  env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
  env.update({name: str(home) for name in ("HOME", "WANDB_DIR", "WANDB_CONFIG_DIR",
                                           "WANDB_CACHE_DIR", "WANDB_DATA_DIR")})
  env.update(NETRC=str(home / ".netrc"), PYTHONPATH=ROOT)
  code = ("from transformer.training import wandb_log\n"
          "try:\n"
          f"  wandb_log.WandbWriter({str(tmp_path)!r}, 'tests')\n"
          "except ValueError as e:\n"
          "  print(e)\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=120)
  assert proc.stdout.startswith("log.wandb_project='tests': W&B did not start ("), (
      proc.stdout + proc.stderr[-2000:])
  assert "run `wandb login`, set WANDB_API_KEY" in proc.stdout
