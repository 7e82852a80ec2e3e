"""Keep freed host memory in the process, so XLA:CPU steps stop page-faulting.

XLA:CPU allocates each step's temporaries (activations, gradients: hundreds of MB) with
malloc from its worker threads and frees them when the step ends. glibc gives every such
thread its own arena and serves large blocks with mmap, and returns both to the kernel on
free; the next step then faults every page back in and the kernel zeroes it, a large share
of a step's CPU time (experiments/benchmarks/train_throughput.py reports faults per step;
figures in docs/performance.md).

One arena, no mmap and no trimming make each step reuse the pages of the step before. The
cost: the heap keeps its high-water mark, so a step whose temporaries are allocated before
the previous step's are freed leaves the heap holding both (the train command therefore runs
large steps synchronously: transformer/training/host.py). Call before JAX starts its
threads (before the first computation); a no-op off glibc.

Only when JAX will compute on the CPU: on a GPU/TPU host the big buffers live on the device,
and one malloc arena shared by the data-loading threads costs more than it saves.
"""

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform

# mallopt parameter numbers from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def cpu_backend() -> bool:
  """Whether JAX will compute on the CPU, told without starting a backend (which would start
  the threads these settings must precede): the first of JAX_PLATFORMS / jax_platforms when
  set, else whether an accelerator is installed for JAX to pick (a PJRT plugin, as
  jax[cuda12] brings, or libtpu, as jax[tpu] does)."""
  import jax  # pylint: disable=g-import-not-at-top  # importing jax starts no backend
  platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip().lower() == "cpu"
  if importlib.util.find_spec("libtpu") is not None:
    return False
  if importlib.metadata.entry_points(group="jax_plugins"):
    return False
  try:
    import jax_plugins  # pylint: disable=g-import-not-at-top  # the plugins' namespace package
  except ImportError:
    return True
  return not any(True for _ in pkgutil.iter_modules(jax_plugins.__path__))


def retain_freed_memory() -> bool:
  """Sets glibc malloc to reuse freed memory in-process; True if it applied (glibc and the
  CPU backend only)."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  if not cpu_backend():
    return False
  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  # -1 is SIZE_MAX once glibc widens it: never trim the heap top.
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  return all(libc.mallopt(param, value) == 1 for param, value in settings)
