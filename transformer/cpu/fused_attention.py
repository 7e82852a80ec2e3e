"""Fused exact attention for x86 CPUs with AVX-512 or AVX2 and FMA (float32):
transformer/cpu/fused_attention.cc, compiled on first use with the system's C++ compiler and
called through XLA's FFI. The same library holds the decoding step's kernel
(cached_attention.cc, called from cached_attention.py).

Why a kernel: XLA:CPU writes each block of scores to memory between the q.k product, the
softmax and the p.v product (and reads them back several times in the backward pass); the
kernel keeps a tile of 64 queries' scores in cache throughout and recomputes them in the
backward pass from the saved log-sum-exp (timings against `query_blocks`:
docs/performance.md).

The library builds into $TRANSFORMER_KERNEL_CACHE (default ~/.cache/transformer; the temp
directory if that is not writable), keyed by the source, the compiler flags, jaxlib's
version and the CPU's feature flags, so an edit or another machine rebuilds it. Where it
cannot be built (no compiler, neither AVX-512 nor AVX2, not Linux x86-64) `unavailable()`
says why and `attention.auto` uses `query_blocks` instead.
"""

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning

SOURCE = pathlib.Path(__file__).with_suffix(".cc")
SOURCES = (SOURCE, SOURCE.with_name("cached_attention.cc"))  # one library, both kernels
# Their 16-float vector operations (AVX-512 or AVX2) and their thread-pool loop.
HEADERS = (SOURCE.with_name("vector16.h"), SOURCE.with_name("parallel.h"))
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
QUERY_TILE = 64  # queries per tile (QB in the source)
_TARGETS = {"fwd": "TransformerAttentionForward", "bwd": "TransformerAttentionBackward",
            "cached": "TransformerCachedAttention"}


def _cpu_flags() -> str:
  try:
    text = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return ""
  return next((line for line in text.splitlines() if line.startswith("flags")), "")


def _flags() -> tuple[str, ...]:
  """The compiler flags. TRANSFORMER_KERNEL_ISA=avx2 builds the AVX2 code on a CPU that has
  AVX-512 too (the tests check both instruction sets' code wherever the CPU runs both)."""
  isa = os.environ.get("TRANSFORMER_KERNEL_ISA", "")
  if isa not in ("", "avx2"):
    raise RuntimeError(f"TRANSFORMER_KERNEL_ISA={isa!r}: use 'avx2' or leave it unset")
  return _FLAGS + (("-mno-avx512f",) if isa == "avx2" else ())


def cache_dir() -> pathlib.Path:
  default = pathlib.Path.home() / ".cache" / "transformer"
  return pathlib.Path(os.environ.get("TRANSFORMER_KERNEL_CACHE", default))


def _build() -> pathlib.Path:
  """The compiled library, built unless this source/flags/CPU/jaxlib has been built before."""
  cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
  if cxx is None:
    raise RuntimeError("no C++ compiler found (set CXX)")
  flags = _flags()
  parts = [*(f.read_text() for f in SOURCES + HEADERS), cxx, *flags, _cpu_flags(),
           jax.lib.__version__]
  key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
  name = f"cpu_attention-{key}.so"
  # A read-only home (some clusters, CI sandboxes) falls back to the temp directory.
  dirs = [cache_dir(), pathlib.Path(tempfile.gettempdir()) / f"transformer-{os.getuid()}"]
  for directory in dirs:
    if (directory / name).exists():
      return directory / name
  for directory in dirs:
    try:
      directory.mkdir(parents=True, exist_ok=True)
      # Several processes may build at once (tests, jax.distributed hosts): each writes its
      # own file and renames it into place, which is atomic.
      fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
      break
    except OSError as e:
      error = e
  else:
    raise RuntimeError(f"no writable directory for the library ({error})")
  os.close(fd)
  path = directory / name
  start = time.perf_counter()
  cmd = [cxx, *flags, "-I", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
  result = subprocess.run(cmd, capture_output=True, text=True)
  if result.returncode:
    os.unlink(tmp)
    first = (result.stderr.strip().splitlines() or ["(no output)"])[0]
    raise RuntimeError(f"{os.path.basename(cxx)} failed: {first}")
  os.replace(tmp, path)
  logging.info("built %s in %.1f s", path, time.perf_counter() - start)
  return path


@functools.cache
def unavailable() -> str | None:
  """None when the kernel is built and registered, else why not (one line)."""
  if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
    return f"the fused CPU kernel needs Linux on x86-64 (this is {platform.system()} " \
           f"{platform.machine()})"
  cpu = set(_cpu_flags().split())
  if "avx512f" not in cpu and not {"avx2", "fma"} <= cpu:
    return "the fused CPU kernel needs a CPU with AVX-512 (avx512f) or AVX2 and FMA"
  try:
    lib = ctypes.cdll.LoadLibrary(str(_build()))
  except (RuntimeError, OSError) as e:
    return f"the fused CPU kernel could not be built: {e}"
  for kind, symbol in _TARGETS.items():
    jax.ffi.register_ffi_target(f"transformer_attention_{kind}",
                                jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  return None


def shared_refusal(kernel: str, layout, terms) -> str | None:
  """The checks both CPU kernels make (`kernel`: "fused" or "cached"). The backend comes
  first, so a GPU or TPU process never builds the library."""
  if jax.default_backend() != "cpu":
    return f"the {kernel} CPU kernel runs on the CPU backend, not {jax.default_backend()!r}"
  if (why := unavailable()) is not None:
    return why
  if terms.bias_table is not None:
    return f"the {kernel} CPU kernel cannot add a score bias ({terms.bias_kind})"
  if layout.k_prefix_BS is not None:
    return f"the {kernel} CPU kernel does not support prefix-LM masks"
  return None


def refusal(q_BLNH, k_BSKH, layout, terms) -> str | None:
  """Why this call cannot use the kernel (None: it can)."""
  if (why := shared_refusal("fused", layout, terms)) is not None:
    return why
  if q_BLNH.dtype != jnp.float32 or k_BSKH.dtype != jnp.float32:
    return f"the fused CPU kernel computes in float32 (inputs are {q_BLNH.dtype})"
  if q_BLNH.shape[-1] % 16:
    return f"the fused CPU kernel needs a head size divisible by 16, got {q_BLNH.shape[-1]}"
  if layout.window:
    return "the fused CPU kernel does not support a sliding window"
  return None


def cores() -> int:
  """The cores this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def threads(mesh=None) -> int:
  """The threads a kernel call takes: the cores its devices share. Unpartitioned (mesh None),
  the call runs on one device while any others idle (a single-device jit in a process with
  per-core devices), so every core; split over a mesh, each device its share, so per-core
  devices don't oversubscribe."""
  return cores() if mesh is None else max(1, cores() // mesh.size)


def _rule(kind: str, groups: int) -> str:
  """Shardy's rule: batch rows and key/value heads (with their query heads) may be sharded;
  lengths and head sizes are whole on every device. (A factor of size 1 may not be part of
  a compound one, hence n = k without groups.)"""
  n = "(k g)" if groups > 1 else "k"
  ins = f"b l {n} h, b s k h, b s k h, b l, b s, b l, b s"
  if kind == "fwd":
    return f"{ins} -> b l {n} h, b {n} l"
  return f"{ins}, b l {n} h, b {n} l, b l {n} h -> b l {n} h, b s k h, b s k h"


@functools.cache
def _op(kind: str, groups: int, statics: tuple):
  scale, causal, offset_known, offset = statics

  def caller(n_threads):
    def call(*args):
      q, k = args[0], args[1]
      B, L, N, _ = q.shape
      if kind == "fwd":
        out = (jax.ShapeDtypeStruct(q.shape, jnp.float32),
               jax.ShapeDtypeStruct((B, N, L), jnp.float32))
      else:
        out = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, k))
      return jax.ffi.ffi_call(f"transformer_attention_{kind}", out)(
          *args, scale=np.float32(scale), causal=causal, offset_known=offset_known,
          offset=np.int64(offset), threads=np.int64(n_threads))
    return call

  op = custom_partitioning(caller(threads()))

  def partition(mesh, arg_shapes, result_shape):
    return (mesh, caller(threads(mesh)),
            jax.tree.map(lambda r: r.sharding, result_shape),
            tuple(a.sharding for a in arg_shapes))

  extra = {"g": groups} if groups > 1 else {}
  rule = _rule(kind, groups)
  # Shardy wants these in the order the factors first appear in the rule.
  whole = tuple(sorted(("l", "s", "h", *extra), key=lambda f: rule.index(f" {f}")))
  op.def_partition(partition=partition, sharding_rule=rule, need_replication_factors=whole,
                   **extra)
  return op


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _attention(q_BLNH, k_BSKH, v_BSKH, qseg_BL, kseg_BS, qidx_BL, kidx_BS, statics):
  return _forward(q_BLNH, k_BSKH, v_BSKH, qseg_BL, kseg_BS, qidx_BL, kidx_BS, statics)[0]


def _forward(q_BLNH, k_BSKH, v_BSKH, qseg_BL, kseg_BS, qidx_BL, kidx_BS, statics):
  groups = q_BLNH.shape[2] // k_BSKH.shape[2]
  layout = (qseg_BL, kseg_BS, qidx_BL, kidx_BS)
  out_BLNH, lse_BNL = _op("fwd", groups, statics)(q_BLNH, k_BSKH, v_BSKH, *layout)
  return out_BLNH, (q_BLNH, k_BSKH, v_BSKH, layout, out_BLNH, lse_BNL)


def _backward(statics, saved, dout_BLNH):
  q_BLNH, k_BSKH, v_BSKH, layout, out_BLNH, lse_BNL = saved
  groups = q_BLNH.shape[2] // k_BSKH.shape[2]
  grads = _op("bwd", groups, statics)(q_BLNH, k_BSKH, v_BSKH, *layout, out_BLNH, lse_BNL,
                                      dout_BLNH)
  return (*grads, None, None, None, None)  # no gradients for the integer layout arrays


_attention.defvjp(_forward, _backward)


def attention(q_BLNH, k_BSKH, v_BSKH, layout, *, scale):
  """softmax(q k^T * scale, masked by layout) v, exactly; float32 [B, L, N, H]."""
  if (why := unavailable()) is not None:  # also registers the kernel on first use
    raise RuntimeError(why)
  offset = layout.index_offset
  statics = (float(scale), bool(layout.causal), offset is not None, int(offset or 0))
  i32 = lambda x: x.astype(jnp.int32)
  return _attention(q_BLNH, k_BSKH, v_BSKH, i32(layout.q_seg_BL), i32(layout.k_seg_BS),
                    i32(layout.q_idx_BL), i32(layout.k_idx_BS), statics)
