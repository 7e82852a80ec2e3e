"""Process-wide host settings for training programs: XLA:CPU device count, malloc retention,
dispatch."""

import os
from typing import Sequence

import jax
import ml_collections

from transformer.cpu import host_memory
from transformer.training import sharding

# A step's temporaries grow with tokens x width x depth: about 110 bytes per unit in the
# compiled W1 and W2 steps (465 MB and 1.8 GB; experiments/benchmarks/train_throughput.py
# prints them). From this many units (~0.45 GB of temporaries) up, the train command runs its
# steps synchronously (configure_host).
SYNC_DISPATCH_UNITS = 1 << 22


def large_step(config: ml_collections.ConfigDict) -> bool:
  """Whether one micro-batch's step holds enough temporaries (by the estimate above) that a
  second copy of them on the retained heap costs more than synchronous dispatch does."""
  model = config.model
  layers = model.num_layers
  if model.kind == "encoder_decoder":
    layers = (model.num_encoder_layers or layers) + (model.num_decoder_layers or layers)
  tokens = config.train.batch_size * config.data.get("seq_len", 0) // max(
      config.opt.get("grad_accum_steps", 1), 1)
  return tokens * model.d_model * layers >= SYNC_DISPATCH_UNITS


def configure_host(configs: Sequence[ml_collections.ConfigDict] = (), *, cpu_devices: int = 1,
                   retain_host_memory: bool = True, num_processes: int = 1) -> bool:
  """Process-wide settings (the train command's --cpu_devices, --retain_host_memory and
  --num_processes; `cli.host_settings()` reads them), for every program that trains through
  this module (the experiments too). Call before JAX's first computation starts its threads.

  `configs`: the runs this process will train, which `cpu_devices=0` fits the device
  count to (with none, one device). True if freed host memory is now retained.

  With the heap retained and a large step (`large_step`), a computation on one device runs
  in the thread that calls it (XLA:CPU's asynchronous dispatch off). Dispatched
  asynchronously, the next step could allocate its temporaries before the one before had
  freed its own (the free follows the outputs being ready by up to milliseconds, so waiting
  for the outputs is not enough), and the retained heap then held two or three steps'
  temporaries: twice the peak memory (docs/performance.md). Called synchronously, a step has
  freed them when the call returns. What it costs: the loop's host work between steps is no
  longer hidden behind the running step, a few ms, which only matters for small steps.
  Computations over several devices stay asynchronous."""
  if cpu_devices < 0:
    raise ValueError(f"--cpu_devices={cpu_devices}: use 0 (one per core) or a count")
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = cpu_devices or min(
        [sharding.cpu_device_count(c.mesh.shape, c.train.batch_size, c.opt.grad_accum_steps,
                                   cores, max(num_processes, 1)) for c in configs]
        or [1])
    jax.config.update("jax_num_cpu_devices", count)
  retained = retain_host_memory and host_memory.retain_freed_memory()
  if retained and any(large_step(c) for c in configs):
    jax.config.update("jax_cpu_enable_async_dispatch", False)
  return retained
