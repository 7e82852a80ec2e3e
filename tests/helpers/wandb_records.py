"""Reading a W&B offline run back (`<dir>/wandb/offline-run-*/run-<id>.wandb`), for the tests.

The file is W&B's record log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
LevelDB-log chunks (CRC32C, length, type: full/first/middle/last) whose payloads are
`wandb_internal_pb2.Record` protocol buffers.
"""

import glob
import json
import os
import struct
import time

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str):
  from wandb.proto import wandb_internal_pb2
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", f"{path} is not a W&B run file"
  pos, payload = 7, b""
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
      pos += BLOCK - pos % BLOCK
      continue
    _, length, kind = struct.unpack_from("<IHB", data, pos)
    if pos + 7 + length > len(data):  # a chunk still being written
      return
    payload += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (FULL, LAST):
      yield wandb_internal_pb2.Record.FromString(payload)
      payload = b""


def finished_records(path: str, timeout_s: float = 60.0) -> list:
  """The records of a run file once its "exit" record is there: `run.finish()` can return
  before W&B's service has written the file (read at once, a resumed run's file has been
  seen empty, then complete a moment later)."""
  deadline = time.monotonic() + timeout_s
  while True:
    out = list(records(path))
    if out and out[-1].WhichOneof("record_type") == "exit":
      return out
    if time.monotonic() > deadline:
      raise AssertionError(f"{path} has no exit record after {timeout_s:.0f} s: "
                           f"{[r.WhichOneof('record_type') for r in out]}")
    time.sleep(0.1)


def offline_runs(wandb_dir: str) -> list[dict]:
  """Each offline run under `wandb_dir`, oldest first: its id, history rows and config."""
  runs = []
  for run_dir in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*"))):
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    run = {"id": None, "history": [], "config": {}, "summary": {}}
    for record in finished_records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run["id"] = record.run.run_id
      elif kind == "history":
        run["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                               for item in record.history.item})
      elif kind == "config":
        run["config"].update({item.key: json.loads(item.value_json)
                              for item in record.config.update if item.key})
      elif kind == "summary":
        run["summary"].update({item.key or "/".join(item.nested_key):
                               json.loads(item.value_json) for item in record.summary.update})
    runs.append(run)
  return runs
