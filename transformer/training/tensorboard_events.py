"""TensorBoard event files, written by tensorboardX (no TensorFlow): scalars, the config as
text and, at the end, the hparams with the final metrics (TensorBoard's HParams tab compares
the runs of a sweep by them).

On resume every session writes a new file. `cut_back` first removes the records past the
restored step from the earlier files (rewritten atomically), and the new file begins with a
SessionLog START at the first new step (what tensorboardX's `purge_step` writes):
TensorBoard purges points at or past a START's step from what it loaded before, so the
charts show each step once even if old files are copied in from elsewhere.

tensorboardX writes but does not read; reading (for `cut_back` and the tests) parses the
TFRecord framing with tensorboardX's CRC and its `Event` protocol buffer.
"""

import contextlib
import glob
import os
import struct
import sys
import time


@contextlib.contextmanager
def _without_torch():
  """tensorboardX's package __init__ imports torch whenever it is installed (the interop
  extra), only so its SummaryWriter can take torch tensors; nothing here passes one, and torch
  adds ~180 MiB to the train command's resident memory (docs/performance.md). Its import is
  refused while tensorboardX loads, then allowed again for anyone else."""
  blocked = "torch" not in sys.modules
  if blocked:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
  try:
    yield
  finally:
    if blocked and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]


with _without_torch():
  from tensorboardX import summary as tbx_summary
  from tensorboardX.event_file_writer import EventsWriter
  from tensorboardX.proto.event_pb2 import Event, SessionLog
  from tensorboardX.record_writer import masked_crc32c

PREFIX = "events.out.tfevents."


class EventWriter:
  """One new `events.out.tfevents.*` file in `logdir`, written synchronously.

  tensorboardX's SummaryWriter queues events for a thread that flushes every few seconds;
  a kill would lose the last ones, which the steps up to a checkpoint must survive (a resume
  cuts back to that step and no further). So this writes tensorboardX's summaries through
  its synchronous EventsWriter and flushes after every call, as metrics.jsonl does."""

  def __init__(self, logdir: str, restart_step: int | None = None):
    """`restart_step`: a resumed session's first step, recorded as a SessionLog START."""
    os.makedirs(logdir, exist_ok=True)
    # tensorboardX names files by the second and host alone, and opens them with "wb": a
    # session starting within the same second as the last would truncate its file.
    suffix = f".{os.getpid()}.{time.time_ns()}"
    self._writer = EventsWriter(os.path.join(logdir, "events"), suffix)
    (self.path,) = glob.glob(os.path.join(glob.escape(logdir), PREFIX + "*" + suffix))
    if restart_step is not None:
      self._write(Event(step=restart_step, session_log=SessionLog(status=SessionLog.START)))

  def _write(self, event: Event) -> None:
    event.wall_time = time.time()
    self._writer.write_event(event)
    self._writer.flush()

  def _summaries(self, step: int, summaries) -> None:
    for summary in summaries:
      self._writer.write_event(Event(wall_time=time.time(), step=step, summary=summary))
    self._writer.flush()

  def scalars(self, step: int, values: dict[str, float]) -> None:
    self._summaries(step, [tbx_summary.scalar(tag, float(value))
                           for tag, value in values.items()])

  def text(self, tag: str, text: str, step: int) -> None:
    """Markdown (TensorBoard's Text tab); indented by four spaces it renders verbatim."""
    self._summaries(step, [tbx_summary.text(tag, text)])

  def hparams(self, hparams: dict, metrics: dict[str, float], step: int) -> None:
    """The run's settings and final metrics as one HParams session: this log directory.

    Metric names should start with "final/" (HPARAMS_TAGS: a resume drops them). They are
    also written as scalars at `step` (the HParams tab reads their value there). Values
    other than bool/int/float/str (tuples) are shown as strings."""
    values = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
              for k, v in hparams.items() if v is not None}
    self._summaries(step, list(tbx_summary.hparams(values, metrics)))
    self.scalars(step, metrics)

  def close(self) -> None:
    self._writer.close()


def _frame(record: bytes) -> bytes:
  length = struct.pack("<Q", len(record))
  return (length + struct.pack("<I", masked_crc32c(length)) + record
          + struct.pack("<I", masked_crc32c(record)))


def _records(path: str, tolerate_torn_tail: bool = False):
  """The Event payloads of an event file, in order. A record cut short at the end of the file
  (a kill mid-write) ends the iteration when `tolerate_torn_tail`, else is an error."""
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    if pos + 12 > len(data) and tolerate_torn_tail:
      return
    (length,) = struct.unpack_from("<Q", data, pos)
    if struct.unpack_from("<I", data, pos + 8)[0] != masked_crc32c(data[pos:pos + 8]):
      raise ValueError(f"{path}: corrupt record length at byte {pos}")
    if pos + 16 + length > len(data) and tolerate_torn_tail:
      return
    record = data[pos + 12:pos + 12 + length]
    if struct.unpack_from("<I", data, pos + 12 + length)[0] != masked_crc32c(record):
      raise ValueError(f"{path}: corrupt record at byte {pos}")
    pos += 16 + length
    yield record


HPARAMS_TAGS = ("_hparams_/", "final/")


def _ends_a_run(event: Event) -> bool:
  return any(v.tag.startswith(HPARAMS_TAGS) for v in event.summary.value)


def cut_back(path: str, step: int) -> tuple[int, int]:
  """Drop the records of steps > `step` (and a torn last record) from an event file,
  rewriting it atomically. A finished session's hparams and final metrics go too: the run
  goes on, and TensorBoard's HParams tab would keep the first session's settings it finds.
  Returns how many records were dropped: (past `step` or torn, of an earlier end)."""
  records = list(_records(path, tolerate_torn_tail=True))
  events = [Event.FromString(r) for r in records]
  past = sum(e.step > step for e in events)
  ended = sum(e.step <= step and _ends_a_run(e) for e in events)
  kept = [r for r, e in zip(records, events) if e.step <= step and not _ends_a_run(e)]
  torn = os.path.getsize(path) != sum(16 + len(r) for r in records)
  if len(kept) == len(records) and not torn:
    return 0, 0
  # Not named *tfevents*: TensorBoard (and the next RunLog) would read a leftover as a file of
  # its own, and show its steps twice.
  tmp = os.path.join(os.path.dirname(path), f".cut_back.{os.getpid()}.tmp")
  try:
    with open(tmp, "wb") as f:
      f.write(b"".join(_frame(r) for r in kept))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return past + int(torn), ended


def read_events(path: str) -> list[Event]:
  """Every event of a file, as `Event` protocol buffers (the tests see restarts by them)."""
  return [Event.FromString(r) for r in _records(path)]


def read_scalars(path: str) -> list[tuple[int, str, float]]:
  """(step, tag, value) triples of the file's scalars, in order."""
  return [(event.step, value.tag, value.simple_value)
          for event in read_events(path) for value in event.summary.value
          if value.WhichOneof("value") == "simple_value"]
