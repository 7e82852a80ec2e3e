"""A full disk during a save (issue 23): refused before writing when it cannot fit, one line
when orbax's writers fail, the last complete checkpoint intact. End to end on a real tmpfs:
faults_test.py."""

import errno
import logging
import os
import sys
import threading
import types

import numpy as np
import pytest

from helpers import tiny_run
from transformer.training import checkpoint, checkpoint_integrity, disk_space


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def saved_once(request, tmp_path):
  """(config, manager) with a complete step-1 checkpoint, async or synchronous saves."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), async_save=request.param)
  checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config)
  checkpoint.finish(manager)
  return config, manager


def test_a_save_that_cannot_fit_is_refused_in_one_line_before_writing(tmp_path, monkeypatch,
                                                                      saved_once):
  config, manager = saved_once
  monkeypatch.setattr(disk_space, "_free_bytes", lambda path: 100)
  with pytest.raises(disk_space.DiskFull, match=(
      rf"^no space left on the device of {tmp_path}/checkpoints for the step-2 checkpoint "
      r"\(about \d+\.\d KiB needed, 100 bytes free\); the last complete checkpoint, step 1, "
      r"is intact: free some space and re-run the same command to resume$")):
    checkpoint.save(manager, 2, tiny_run.toy_state(2), {}, config)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
  manager.close()


def test_enospc_inside_a_save_is_one_line_and_leaves_the_last_checkpoint(tmp_path, monkeypatch,
                                                                        saved_once):
  """The disk filling up while orbax writes (its writer threads, when async)."""
  from orbax.checkpoint._src.path import atomicity
  config, manager = saved_once

  async def full(self):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.get()))
  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", full)
  with pytest.raises(disk_space.DiskFull, match=(
      rf"^no space left on the device of {tmp_path}/checkpoints saving the step-2 checkpoint "
      r"\(.* free\); the last complete checkpoint, step 1, is intact: free some space")):
    checkpoint.save(manager, 2, tiny_run.toy_state(2), {}, config)
    checkpoint.finish(manager)  # an async save fails in the background
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]  # the partial step removed
  assert checkpoint_integrity.problem(str(tmp_path / "checkpoints" / "1")) is None
  checkpoint.close(manager, failing=True)


def test_disk_full_is_recognized_through_orbax_and_tensorstore_errors():
  tensorstore = ValueError("RESOURCE_EXHAUSTED: Error writing local file \"x\": No space left "
                           "on device [os_error_code='28']")
  assert disk_space.disk_full(tensorstore, "/w") is not None
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")
    except OSError as e:
      raise RuntimeError("wrapped") from e
  except RuntimeError as e:
    line = str(disk_space.disk_full(e, "/w"))
  assert line.startswith("no space left on the device of /w/metrics.jsonl (")
  assert disk_space.disk_full(ValueError("shape mismatch"), "/w") is None


def test_asyncio_s_report_of_a_failed_write_is_dropped_and_others_are_kept(tmp_path, caplog):
  """At exit asyncio logs a failed write's never-retrieved future, with the ENOSPC inside."""
  import logging
  checkpoint.make_manager(str(tmp_path)).close()
  full = ValueError("RESOURCE_EXHAUSTED: Failed writing: No space left on device "
                    "[os_error_code='28']")
  with caplog.at_level(logging.ERROR):
    logging.getLogger("asyncio").error("Future exception was never retrieved",
                                       exc_info=(ValueError, full, None))
    logging.getLogger("asyncio").error("Task was destroyed but it is pending!")
  assert [r.getMessage() for r in caplog.records] == ["Task was destroyed but it is pending!"]


def test_disk_full_is_recognized_through_implicit_chaining_and_quotas():
  """An ENOSPC that another error replaced while handling it (no `from`), and a quota's EDQUOT,
  are a full disk too."""
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/w/x")
    except OSError:
      raise RuntimeError("orbax: commit failed")  # pylint: disable=raise-missing-from
  except RuntimeError as e:
    assert disk_space.disk_full(e, "/w") is not None
  assert disk_space.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded", "/w/y"), "/w")


def test_the_space_a_save_needs_is_the_newest_step_s_or_the_state_s(tmp_path, monkeypatch):
  """Before the first save the need is the state's bytes; then the newest step's size on disk
  (the state only grows: an older, smaller step would let a save that cannot fit start)."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), keep=3, keep_best=0)
  big = {"params": {"w": np.ones((64, 1024), np.float32)}, "step": np.int32(0)}  # 256 KiB
  monkeypatch.setattr(disk_space, "_free_bytes", lambda path: 200 * 1024)
  with pytest.raises(disk_space.DiskFull, match=r"about 256\.\d KiB needed, 200\.0 KiB free\); "
                                                r"no checkpoint was completed yet"):
    checkpoint.save(manager, 1, big, {}, config)
  monkeypatch.undo()
  checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config)
  random = {"params": {"w": np.random.default_rng(0).normal(size=(64, 1024)).astype(np.float32)},
            "step": np.int32(2)}  # incompressible: its step on disk is ~256 KiB
  checkpoint.save(manager, 2, random, {}, config)
  checkpoint.finish(manager)
  monkeypatch.setattr(disk_space, "_free_bytes", lambda path: 200 * 1024)
  with pytest.raises(disk_space.DiskFull, match=r"step 2, is intact"):
    checkpoint.save(manager, 3, tiny_run.toy_state(3), {}, config)
  manager.close()


def test_tensorstore_s_error_code_alone_is_a_full_disk():
  """tensorstore may name ENOSPC only by its code."""
  code_only = ValueError("RESOURCE_EXHAUSTED: Error writing local file \"x\" "
                         "[os_error_code='28']")
  assert disk_space.disk_full(code_only, "/w") is not None


def test_only_the_abandoned_writes_runtime_errors_are_dropped(monkeypatch):
  """The hooks installed with the first manager drop exactly the closed-event-loop and
  shutdown RuntimeErrors of orbax's abandoned writes; every other exception still prints."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(("u", str(info.exc_value))))
  monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(("t", str(args.exc_value))))
  disk_space.drop_abandoned_write_noise()
  for error in (RuntimeError("Event loop is closed"), RuntimeError("something else"),
                ValueError("Event loop is closed"),
                RuntimeError("cannot schedule new futures after interpreter shutdown")):
    sys.unraisablehook(types.SimpleNamespace(exc_value=error))
    threading.excepthook(types.SimpleNamespace(exc_value=error))
  assert seen == [("u", "something else"), ("t", "something else"),
                  ("u", "Event loop is closed"), ("t", "Event loop is closed")]


def test_once_a_full_disk_was_reported_the_partial_step_s_complaints_go(monkeypatch):
  """After a DiskFull removed a partial step, orbax's writers' complaints about its temporary
  folder are dropped; before it, and for other messages, nothing is."""
  noise = logging.LogRecord("absl", logging.ERROR, __file__, 1,
                            "cannot finalize /w/checkpoints/2.orbax-checkpoint-tmp-17", None, None)
  other = logging.LogRecord("absl", logging.WARNING, __file__, 1, "something else", None, None)
  log_filter = disk_space.DiskFullNoiseFilter()
  monkeypatch.setattr(disk_space.DiskFullNoiseFilter, "abandoned", False)
  assert log_filter.filter(noise) and log_filter.filter(other)
  monkeypatch.setattr(disk_space.DiskFullNoiseFilter, "abandoned", True)
  assert not log_filter.filter(noise) and log_filter.filter(other)
