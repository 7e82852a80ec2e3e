"""TensorBoard event files readable back; run logs written by process 0 only."""

import json
import os

import ml_collections
import pytest

from transformer.training import run_log, tensorboard_events


def test_crc32c_known_answer():
  assert tensorboard_events.crc32c(b"123456789") == 0xE3069283


def test_event_file_round_trip(tmp_path):
  writer = tensorboard_events.EventWriter(str(tmp_path))
  writer.scalars(1, {"loss": 2.5, "lr": 1e-3})
  writer.scalars(10**10, {"loss": 0.25})
  writer.close()
  assert tensorboard_events.read_scalars(writer.path) == [
      (1, "loss", 2.5), (1, "lr", pytest.approx(1e-3, rel=1e-6)), (10**10, "loss", 0.25)]


def test_run_log_files_and_progress_line(tmp_path, capsys):
  log = run_log.RunLog(str(tmp_path), total_steps=100, enabled=True)
  log.write_config(ml_collections.ConfigDict({"a": 1}))
  log.metrics(10, {"loss": 1.5, "tokens_per_s": 1234.0, "bad": float("nan")})
  log.progress(10, 1.5, 12_345.0, 0.5, eval_loss=1.25)
  log.summary({"final_eval_loss": 1.25})
  log.close()
  assert json.load(open(tmp_path / "config.json")) == {"a": 1}
  assert json.loads(open(tmp_path / "metrics.jsonl").read()) == {
      "step": 10, "loss": 1.5, "tokens_per_s": 1234.0, "bad": "nan"}
  assert json.load(open(tmp_path / "summary.json")) == {"final_eval_loss": 1.25}
  line = capsys.readouterr().out.strip()
  assert line == ("step  10/100 [##------------------] loss 1.5000 | 12.3k tok/s | "
                  "500 ms/step | ETA 0m45s | eval 1.2500")


def test_other_processes_write_nothing(tmp_path):
  log = run_log.RunLog(str(tmp_path), total_steps=10, enabled=False)
  log.metrics(1, {"loss": 1.0})
  log.summary({"x": 1})
  log.close()
  assert os.listdir(tmp_path) == []


def test_a_changed_config_keeps_the_earlier_ones(tmp_path):
  log = run_log.RunLog(str(tmp_path), total_steps=10, enabled=True)
  for a in (1, 1, 2, 3):
    log.write_config(ml_collections.ConfigDict({"a": a}))
  log.close()
  assert json.load(open(tmp_path / "config.json")) == {"a": 3}
  assert json.load(open(tmp_path / "config.1.json")) == {"a": 1}
  assert json.load(open(tmp_path / "config.2.json")) == {"a": 2}
  assert not os.path.exists(tmp_path / "config.3.json")
