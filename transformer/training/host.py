"""Process-wide host settings for training programs: XLA:CPU device count, malloc retention."""

import os
from typing import Sequence

import jax
import ml_collections

from transformer.cpu import host_memory
from transformer.training import sharding


def configure_host(configs: Sequence[ml_collections.ConfigDict] = (), *, cpu_devices: int = 1,
                   retain_host_memory: bool = True, num_processes: int = 1) -> bool:
  """Process-wide settings (the train command's --cpu_devices, --retain_host_memory and
  --num_processes; `cli.host_settings()` reads them), for every program that trains through
  this module (the experiments too). Call before JAX's first computation starts its threads.

  `configs`: the runs this process will train, which `cpu_devices=0` fits the device
  count to (with none, one device). True if freed host memory is now retained."""
  if cpu_devices < 0:
    raise ValueError(f"--cpu_devices={cpu_devices}: use 0 (one per core) or a count")
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = cpu_devices or min(
        [sharding.cpu_device_count(c.mesh.shape, c.train.batch_size, c.opt.grad_accum_steps,
                                   cores, max(num_processes, 1)) for c in configs]
        or [1])
    jax.config.update("jax_num_cpu_devices", count)
  return retain_host_memory and host_memory.retain_freed_memory()
