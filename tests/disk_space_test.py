"""A full disk during a save (issue 23): refused before writing when it cannot fit, one line
when orbax's writers fail, the last complete checkpoint intact. End to end on a real tmpfs:
faults_test.py."""

import errno
import os

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
