"""This process's share of the global batch stream, the same stream on any number of hosts.

The data is cut into `num_shards` shards (default: one per process). Shard s yields rows
s*b .. (s+1)*b-1 of every global batch (b = batch_size / num_shards), and process p owns a
contiguous run of shards, which is exactly the block of rows its devices hold in a
batch-sharded array. So one process with 2 shards feeds the model the same global batches
as two processes with one shard each: runs with the same `num_shards` agree across host
counts, and a job that set it can resume on any number of hosts that divides it without
changing its data order. The default ties the stream to the process count, so a job that left
it at 0 resumes on the number of processes it started with (another is refused).
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
    self.num_shards = num_shards
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
    # The checkpoint holds every shard's position (gather_host_states), so its keys count the
    # shards of the stream it saved. A position in a stream cut another way indexes other data:
    # train.data_shards=0 on another number of processes would resume a different experiment.
    if len(states) != self.num_shards:
      # Only train.data_shards=0 gets here: a changed setting is refused with the config.
      raise ValueError(
          f"the checkpoint's data stream has {len(states)} shards (train.data_shards=0: one "
          f"per process, on the {len(states)} processes that saved it) and this job has "
          f"{self.num_shards}: resume it on {len(states)} processes (a run that sets "
          f"train.data_shards can resume on any number of processes that divides it)")
    missing = [s for s in self.shard_ids if str(s) not in states]
    if missing:
      raise ValueError(f"checkpoint has no data position for shards {missing}; it was "
                       f"saved with a different train.data_shards")
    for s, it in self._iterators.items():
      data.restore_iterator(it, states[str(s)])
