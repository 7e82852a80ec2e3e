"""A TensorBoard scalar event-file writer with no TensorFlow or tensorboard dependency.

The format is small and stable: a TFRecord file (length, masked CRC32C of the length, payload,
masked CRC32C of the payload) whose payloads are `Event` protocol buffers. We write only the
fields TensorBoard needs for scalars, encoding the protobuf wire format by hand:
  Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
  Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
and, when a run resumes, Event.session_log = 7 (SessionLog { status = 1 (START = 1) }).

On resume every session writes a new file. `cut_back` first removes the records past the
restored step from the earlier files (rewritten atomically), and the new file begins with a
SessionLog START at the first new step: TensorBoard purges points at or past a START's step
from what it loaded before, so the charts show each step once even if old files are copied
in from elsewhere.
"""

import os
import socket
import struct
import time


def _crc32c_table():
  table = []
  for n in range(256):
    c = n
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for b in data:
    crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
  out = bytearray()
  n &= (1 << 64) - 1  # negative int64s are ten-byte varints in two's complement
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  return _varint(number << 3 | wire_type) + payload


def _length_delimited(number: int, payload: bytes) -> bytes:
  return _field(number, 2, _varint(len(payload)) + payload)


SESSION_START = 1


def _event(step: int | None = None, summary: bytes | None = None,
           file_version: str | None = None, session_status: int | None = None) -> bytes:
  out = _field(1, 1, struct.pack("<d", time.time()))
  if step is not None:
    out += _field(2, 0, _varint(step))
  if file_version is not None:
    out += _length_delimited(3, file_version.encode())
  if summary is not None:
    out += _length_delimited(5, summary)
  if session_status is not None:
    out += _length_delimited(7, _field(1, 0, _varint(session_status)))
  return out


def _frame(record: bytes) -> bytes:
  length = struct.pack("<Q", len(record))
  return (length + struct.pack("<I", _masked_crc(length)) + record
          + struct.pack("<I", _masked_crc(record)))


class EventWriter:
  """Appends scalar summaries to one `events.out.tfevents.*` file in `logdir`."""

  def __init__(self, logdir: str, restart_step: int | None = None):
    """`restart_step`: a resumed session's first step, recorded as a SessionLog START."""
    os.makedirs(logdir, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
    self.path = os.path.join(logdir, name)
    self._file = open(self.path, "ab")
    self._write(_event(file_version="brain.Event:2"))
    if restart_step is not None:
      self._write(_event(step=restart_step, session_status=SESSION_START))
      self._file.flush()

  def _write(self, record: bytes) -> None:
    self._file.write(_frame(record))

  def scalars(self, step: int, values: dict[str, float]) -> None:
    summary = b"".join(
        _length_delimited(1, _length_delimited(1, tag.encode())
                          + _field(2, 5, struct.pack("<f", float(value))))
        for tag, value in values.items())
    self._write(_event(step=step, summary=summary))
    self._file.flush()

  def close(self) -> None:
    self._file.close()


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
    if struct.unpack_from("<I", data, pos + 8)[0] != _masked_crc(data[pos:pos + 8]):
      raise ValueError(f"{path}: corrupt record length at byte {pos}")
    if pos + 16 + length > len(data) and tolerate_torn_tail:
      return
    record = data[pos + 12:pos + 12 + length]
    if struct.unpack_from("<I", data, pos + 12 + length)[0] != _masked_crc(record):
      raise ValueError(f"{path}: corrupt record at byte {pos}")
    pos += 16 + length
    yield record


def cut_back(path: str, step: int) -> int:
  """Drop the records of steps > `step` (and a torn last record) from an event file,
  rewriting it atomically; returns how many were dropped."""
  records = list(_records(path, tolerate_torn_tail=True))
  kept = [r for r in records if dict(_parse(r)).get(2, 0) <= step]
  torn = os.path.getsize(path) != sum(16 + len(r) for r in records)
  if len(kept) == len(records) and not torn:
    return 0
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(b"".join(_frame(r) for r in kept))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return len(records) - len(kept) + int(torn)


def read_events(path: str) -> list[dict]:
  """Every event as {field number: raw value}: the tests' way to see session restarts."""
  return [dict(_parse(r)) for r in _records(path)]


def read_scalars(path: str) -> list[tuple[int, str, float]]:
  """(step, tag, value) triples from an event file; the tests' way to check the writer."""
  out = []
  for record in _records(path):
    fields = dict(_parse(record))
    if 5 in fields:
      for number, value in _parse(fields[5]):
        parts = dict(_parse(value))
        out.append((fields.get(2, 0), parts[1].decode(), struct.unpack("<f", parts[2])[0]))
  return out


def _parse(buf: bytes):
  """(field number, raw value) pairs of one protobuf message; enough for the above."""
  pos = 0
  while pos < len(buf):
    key, pos = _read_varint(buf, pos)
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      value, pos = _read_varint(buf, pos)
    elif wire_type == 1:
      value, pos = buf[pos:pos + 8], pos + 8
    elif wire_type == 5:
      value, pos = buf[pos:pos + 4], pos + 4
    else:
      size, pos = _read_varint(buf, pos)
      value, pos = buf[pos:pos + size], pos + size
    yield number, value


def _read_varint(buf: bytes, pos: int):
  result = shift = 0
  while True:
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return result, pos
