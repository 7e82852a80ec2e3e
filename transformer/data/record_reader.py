"""A split's array_record files as a random-access source that reads one record cheaply.

`tfds.data_source` reads a single record with `ArrayRecordReader.read([i])`, which hands the
read to a thread pool on every call (google/grain#688, google/array_record#143): about 3 ms
a record on a 2-core host, where `read(i, i + 1)` on the same reader takes about 13 us.
grain asks its source for one record at a time, so on the small models of the scaling study
reading records cost more than the train step itself. This source serves the same records in
the same order as the tfds source it wraps (tests/data_test.py checks every index), so data
streams and saved iterator positions do not change.
"""

import bisect
import threading

from array_record.python import array_record_module


class RangeReadSource:
  """`tfds.data_source(...)`'s records (deserialized the same way), read with range reads."""

  def __init__(self, tfds_source):
    info = tfds_source.dataset_info
    # The tfds source's own file instructions: split slicing ('train[:10%]') included.
    instructions = info.splits[tfds_source.split].file_instructions
    self._files = [(ins.filename, ins.skip, ins.take) for ins in instructions if ins.take]
    self._starts = [0]
    for _, _, take in self._files:
      self._starts.append(self._starts[-1] + take)
    self._features = info.features
    self._readers = [None] * len(self._files)
    self._lock = threading.Lock()
    self.dataset_info, self.split = info, tfds_source.split

  def __len__(self) -> int:
    return self._starts[-1]

  def _reader(self, f: int):
    if self._readers[f] is None:
      with self._lock:  # grain reads from several threads
        if self._readers[f] is None:
          self._readers[f] = array_record_module.ArrayRecordReader(
              self._files[f][0], options="readahead_buffer_size:0",
              file_reader_buffer_size=32768)
    return self._readers[f]

  def __getitem__(self, key):
    i = key.__index__()
    if not 0 <= i < len(self):
      raise IndexError(f"record {i} is out of range for a source of {len(self)} records")
    f = bisect.bisect_right(self._starts, i) - 1
    position = self._files[f][1] + i - self._starts[f]
    record = self._reader(f).read(position, position + 1)[0]
    return self._features.deserialize_example_np(record)

  def __getstate__(self):
    # Readers hold open files: a copy sent to a grain worker process opens its own.
    state = dict(self.__dict__)
    state["_readers"], state["_lock"] = [None] * len(self._files), None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def __repr__(self) -> str:
    return f"RangeReadSource({self.dataset_info.name}, split={self.split!r})"
