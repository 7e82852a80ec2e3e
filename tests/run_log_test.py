"""TensorBoard event files readable back; run logs written by process 0 only."""

import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import time

import ml_collections
import pytest

from transformer.training import run_log, tensorboard_events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _accumulator(logdir):
  """TensorBoard's own reader: what its charts and its Text and HParams tabs are built from
  (it also applies SessionLog START purges)."""
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
  acc.Reload()
  return acc


def test_tensorboard_reads_scalars_config_text_and_hparams(tmp_path):
  writer = tensorboard_events.EventWriter(str(tmp_path))
  writer.scalars(1, {"loss": 2.5, "lr": 1e-3})
  writer.scalars(10**10, {"loss": 0.25})
  writer.text("config", "    model: 1", 0)
  writer.hparams({"opt.lr": 1e-3, "mesh.shape": (1, 2), "model.ffn": "gelu", "x.on": True},
                 {"final/eval_loss": 1.5}, 7)
  writer.close()
  assert tensorboard_events.read_scalars(writer.path) == [
      (1, "loss", 2.5), (1, "lr", pytest.approx(1e-3, rel=1e-6)), (10**10, "loss", 0.25),
      (7, "final/eval_loss", 1.5)]

  acc = _accumulator(tmp_path)
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (10**10, 0.25)]
  assert [e.step for e in acc.Scalars("final/eval_loss")] == [7]
  (text,) = acc.Tensors("config/text_summary")
  assert text.tensor_proto.string_val == [b"    model: 1"]
  from tensorboard.plugins.hparams import plugin_data_pb2
  content = acc.PluginTagToContent("hparams")
  start = plugin_data_pb2.HParamsPluginData.FromString(
      content["_hparams_/session_start_info"]).session_start_info
  assert start.hparams["opt.lr"].number_value == pytest.approx(1e-3)
  assert start.hparams["mesh.shape"].string_value == "(1, 2)"
  assert start.hparams["model.ffn"].string_value == "gelu"
  assert start.hparams["x.on"].bool_value is True
  experiment = plugin_data_pb2.HParamsPluginData.FromString(
      content["_hparams_/experiment"]).experiment
  assert [m.name.tag for m in experiment.metric_infos] == ["final/eval_loss"]


def test_resume_cuts_events_back_and_tensorboard_shows_each_step_once(tmp_path):
  """A session logged steps 1..6 and died; the checkpoint was step 4. The resumed session's
  RunLog drops 5..6 from the old file and starts its own with a SessionLog START at 5."""
  first = run_log.RunLog(str(tmp_path), total_steps=8, enabled=True)
  for step in range(1, 7):
    first.metrics(step, {"loss": float(step)})
  # The first session dies here (no close): every call so far is on disk.
  with open(first._events.path, "ab") as f:
    f.write(b"\x10\x00\x00")  # a record torn by the kill
  second = run_log.RunLog(str(tmp_path), total_steps=8, enabled=True, start_step=4)
  assert any("dropped 3 records past step 4" in note for note in second.notes)
  for step in range(5, 9):
    second.metrics(step, {"loss": 10.0 + step})
  second.close()
  first.close()  # its files were replaced: this writes nothing more there
  files = sorted(tmp_path.glob("tensorboard/events.out.tfevents.*"))
  assert len(files) == 2
  steps = [s for f in files for s, tag, _ in tensorboard_events.read_scalars(str(f))
           if tag == "loss"]
  assert sorted(steps) == list(range(1, 9))
  starts = [e.step for f in files for e in tensorboard_events.read_events(str(f))
            if e.HasField("session_log")]
  assert starts == [5]
  assert [(e.step, e.value) for e in _accumulator(tmp_path / "tensorboard").Scalars("loss")] == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0), (6, 16.0), (7, 17.0), (8, 18.0)]


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


def test_a_run_trained_further_keeps_only_its_last_end_for_the_hparams_tab(tmp_path):
  for start, steps in ((0, 4), (4, 6)):  # trained to 4 steps, then resumed to 6
    log = run_log.RunLog(str(tmp_path), total_steps=steps, enabled=True, start_step=start)
    for step in range(start + 1, steps + 1):
      log.metrics(step, {"loss": 1.0 / step})
    log.summary({"final_eval_loss": 1.0 / steps, "step": steps, "loss_floor_exact": False,
                 "config": {"train.steps": steps}})
    log.close()
  from tensorboard.plugins.hparams import plugin_data_pb2
  events = [e for f in sorted(tmp_path.glob("tensorboard/events.*"))
            for e in tensorboard_events.read_events(str(f))]
  starts = [plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
            for e in events for v in e.summary.value if v.tag == "_hparams_/session_start_info"]
  assert [s.session_start_info.hparams["train.steps"].number_value for s in starts] == [6]
  finals = [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value
            if v.tag.startswith("final/")]
  assert finals == [(6, "final/eval_loss", pytest.approx(1 / 6)), (6, "final/step", 6.0)]
  assert sorted(s for f in tmp_path.glob("tensorboard/events.*")
                for s, tag, _ in tensorboard_events.read_scalars(str(f)) if tag == "loss") == [
                    1, 2, 3, 4, 5, 6]


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def _drive(log):
  log.info("hello")
  for step in range(1, 21):
    log.tick(step)
    if step % 10 == 0:
      log.progress(step, 1.5, 12_345.0, 0.5, eval_loss=1.25 if step == 20 else None)
  log.close()


EVAL_LINE = ("step  20/100 [####----------------] loss 1.5000 | 12.3k tok/s | 500 ms/step | "
             "ETA 0m40s | eval 1.2500")


def test_progress_off_a_terminal_is_one_plain_line_per_log_step(tmp_path):
  stream = io.StringIO()  # a file or pipe: what SLURM's log gets
  _drive(run_log.RunLog(str(tmp_path), total_steps=100, enabled=True, stream=stream))
  assert stream.getvalue() == (
      "hello\n"
      "step  10/100 [##------------------] loss 1.5000 | 12.3k tok/s | 500 ms/step | "
      "ETA 0m45s\n" + EVAL_LINE + "\n")


def test_progress_on_a_terminal_is_a_live_bar_with_evals_above_it(tmp_path):
  stream = _Terminal()
  _drive(run_log.RunLog(str(tmp_path), total_steps=100, enabled=True, stream=stream))
  out = stream.getvalue()
  assert "\r" in out  # redrawn in place
  lines = out.replace("\r", "\n").splitlines()
  assert "hello" in lines and EVAL_LINE in lines  # messages and evals stay, as lines
  bars = [line for line in lines if line.startswith("step ") and "|" in line[:20]]
  assert any(line.startswith("step  10/100 |") and
             "| loss 1.5000 | 12.3k tok/s | 500 ms/step [" in line for line in bars), bars
  assert bars[-1].startswith("step  20/100 |") and "| eval 1.2500 [" in bars[-1], bars


@pytest.mark.slow
@pytest.mark.parametrize("width", [160, 0])  # 0: a terminal that reports no size
def test_progress_in_a_real_terminal(tmp_path, width):
  """The same through a pseudo-terminal: sys.stdout.isatty() is what picks the bar."""
  script = (f"import sys; sys.path.insert(0, {ROOT!r})\n"
            "from transformer.training import run_log\n"
            "from run_log_test import _drive\n"
            f"_drive(run_log.RunLog({str(tmp_path)!r}, total_steps=100, enabled=True))\n")
  controller, terminal = pty.openpty()
  if width:
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, width, 0, 0))
  proc = subprocess.Popen([sys.executable, "-c", script], stdout=terminal,
                          stderr=subprocess.PIPE, cwd=os.path.dirname(__file__),
                          env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))
  os.close(terminal)
  out = b""
  while True:
    try:
      chunk = os.read(controller, 4096)
    except OSError:  # EIO: the child closed the terminal
      break
    if not chunk:
      break
    out += chunk
  os.close(controller)
  assert proc.wait(timeout=120) == 0, proc.stderr.read()
  lines = out.decode().replace("\r\n", "\n").replace("\r", "\n").splitlines()
  assert EVAL_LINE in lines and "hello" in lines, lines
  assert any(line.startswith("step  20/100 |") and "| eval 1.2500 [" in line
             for line in lines), lines


def test_the_train_command_does_not_load_torch_through_tensorboardx():
  """tensorboardX imports torch when it is installed (the interop extra); the train command
  never hands it a torch tensor, and torch would cost ~180 MiB of resident memory."""
  import importlib.util
  if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed, so nothing could load it")
  code = ("import sys, transformer.train, transformer.training.tensorboard_events as t; "
          "assert 'torch' not in sys.modules, 'torch was imported'; "
          "import torch; print(torch.ones(2).sum().item())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "2.0"  # torch still imports afterwards, for whoever wants it


def test_a_failed_cut_back_leaves_no_file_tensorboard_would_read(tmp_path, monkeypatch):
  writer = tensorboard_events.EventWriter(str(tmp_path))
  for step in (1, 2, 3):
    writer.scalars(step, {"loss": 1.0})
  writer.close()

  def full(*_):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError):
    tensorboard_events.cut_back(writer.path, 1)
  assert os.listdir(tmp_path) == [os.path.basename(writer.path)]


def test_each_session_shows_its_config_once(tmp_path):
  config = ml_collections.ConfigDict({"train": {"steps": 8}})
  for start in (0, 4, 4):  # trained to 4, then two sessions resumed from the step-4 checkpoint
    log = run_log.RunLog(str(tmp_path), total_steps=8, enabled=True, start_step=start)
    log.write_config(config)
    log.metrics(start + 1, {"loss": 1.0})
    log.close()
  assert sorted(e.step for f in tmp_path.glob("tensorboard/events.*")
                for e in tensorboard_events.read_events(str(f))
                for v in e.summary.value if v.tag.startswith("config")) == [1, 5]


def test_a_resumed_log_goes_on_from_the_wall_time_of_the_restored_step(tmp_path):
  """earlier_wall_time_s is the last kept row's (rows past the restored step are cut first)."""
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for step, wall in ((1, 10.0), (2, 20.0), (3, 30.0)):
      f.write(json.dumps({"step": step, "wall_time_s": wall}) + "\n")
    f.write(json.dumps({"step": 3, "eval_loss": 1.0}) + "\n")  # a row without wall time
  log = run_log.RunLog(str(tmp_path), total_steps=8, enabled=True, start_step=3)
  assert log.earlier_wall_time_s == 30.0
  log.close()
  log = run_log.RunLog(str(tmp_path), total_steps=8, enabled=True, start_step=2)
  assert log.earlier_wall_time_s == 20.0  # step 3's rows were cut
  log.close()
  (tmp_path / "new").mkdir()
  log = run_log.RunLog(str(tmp_path / "new"), total_steps=8, enabled=True)
  assert log.earlier_wall_time_s == 0.0
  log.close()


def test_the_stopwatch_leaves_paused_time_out_of_each_lap(monkeypatch):
  """A lap is the wall time since the last one less the pauses inside it; a pause counts once,
  in its own lap only."""
  now = [100.0]
  monkeypatch.setattr(run_log.time, "perf_counter", lambda: now[0])
  watch = run_log.Stopwatch()
  now[0] += 5.0
  with watch.paused() as timer:
    now[0] += 3.0
  assert timer.seconds == 3.0
  now[0] += 1.0
  assert watch.lap() == 6.0  # 9 s, 3 of them paused
  now[0] += 2.0
  assert watch.lap() == 2.0  # the earlier pause is not taken off again
  assert time.perf_counter() == now[0]


def test_on_a_terminal_only_evals_leave_a_full_line_above_the_bar(tmp_path):
  """A plain log step only redraws the bar: its full line would scroll the terminal every
  log_every steps."""
  stream = _Terminal()
  _drive(run_log.RunLog(str(tmp_path), total_steps=100, enabled=True, stream=stream))
  lines = stream.getvalue().replace("\r", "\n").splitlines()
  assert EVAL_LINE in lines
  assert not [line for line in lines if line.startswith("step  10/100 [")], lines
