"""This process's share of the global batch stream, the same stream on any number of hosts.

The data is cut into `num_shards` shards (default: one per process). Shard s yields rows
s*b .. (s+1)*b-1 of every global batch (b = batch_size / num_shards), and process p owns a
contiguous run of shards, which is exactly the block of rows its devices hold in a
batch-sharded array. So one process with 2 shards feeds the model the same global batches
as two processes with one shard each: runs agree across host counts, and a job can resume
on a different number of hosts without changing its data order.
"""

import jax
import numpy as np

from transformer import data


class ShardedBatches:
  """Iterator of host-local batches (dicts of numpy arrays) for `split`."""

  def __init__(self, config, tokenizer, *, split: str, objective: str, seed: int,
               num_shards: int = 0, num_epochs: int | None = None):
    processes, process = jax.process_count(), jax.process_index()
    num_shards = num_shards or processes
    batch_size = config.train.batch_size
    if num_shards % processes:
      raise ValueError(f"train.data_shards={num_shards} is not a multiple of the "
                       f"{processes} processes")
    if batch_size % num_shards:
      raise ValueError(f"train.batch_size={batch_size} is not divisible by "
                       f"train.data_shards={num_shards}")
    self.split = split
    per_process = num_shards // processes
    self.shard_ids = list(range(process * per_process, (process + 1) * per_process))
    self._iterators = {
        s: data.make_iterator(config.data, tokenizer, split=split,
                              batch_size=batch_size // num_shards, objective=objective,
                              seed=seed, shard_index=s, shard_count=num_shards,
                              num_epochs=num_epochs)
        for s in self.shard_ids}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(self._iterators[s]) for s in self.shard_ids]
    if len(parts) == 1:
      return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_state(self) -> dict:
    """JSON-able positions of this process's shards, keyed by shard id."""
    return {str(s): data.iterator_state(it) for s, it in self._iterators.items()}

  def set_state(self, states: dict) -> None:
    missing = [s for s in self.shard_ids if str(s) not in states]
    if missing:
      raise ValueError(f"checkpoint has no data position for shards {missing}; it was "
                       f"saved with a different train.data_shards")
    for s, it in self._iterators.items():
      data.restore_iterator(it, states[str(s)])
