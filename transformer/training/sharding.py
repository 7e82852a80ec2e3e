"""Devices, the mesh and the logical-axis rules: the only file that knows mesh axis names.

Modules name logical axes ('embed', 'mlp', 'heads', 'batch', ...). `RULES` maps each logical
name to mesh axes. The mesh has three axes:
  data    pure data parallelism: parameters replicated, batch split.
  fsdp    batch split too, and parameters/optimizer state split along 'embed' (ZeRO-3 style);
          XLA all-gathers a weight just before its matmul.
  tensor  Megatron-style model parallelism over heads, mlp and vocab, and between sub-layers
          over the residual stream's positions (sequence parallelism).
"""

import contextlib
import os
import socket
from typing import Any, Sequence

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Order matters within a name: the first mesh axis not already used by an earlier dimension
# of the same array wins (so activations [batch, length, embed] do not put 'embed' on fsdp,
# which 'batch' already took, while weights [embed, mlp] do).
RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("embed", "fsdp"),
    ("head_dim", None),
    # The residual stream's positions, between sub-layers (model/layers.py Block).
    ("residual_length", "tensor"),
    ("length", None),
    ("layers", None),
    ("buckets", None),
)


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0,
                           process_id: int = -1) -> None:
  """Join a multi-process job, if this is one. Must run before anything touches a device.

  Explicit flags win; otherwise jax detects TPU pods, SLURM and Open MPI itself. A plain
  single-process run on a workstation calls nothing, so it cannot hang waiting for peers.
  """
  if coordinator_address or num_processes > 1:
    if not (coordinator_address and num_processes > 0 and process_id >= 0):
      raise ValueError("multi-process needs all of --coordinator_address, --num_processes "
                       "and --process_id (or none of them on TPU/SLURM, which are detected)")
    check_coordinator(coordinator_address)
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif (int(os.environ.get("SLURM_NTASKS", "1")) > 1
        or "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
        or int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1):
    jax.distributed.initialize()
  else:
    return
  logging.info("process %d of %d, %d local devices of %d", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def check_coordinator(address: str) -> None:
  """--coordinator_address as HOST:PORT whose host resolves, refused in one line otherwise:
  jax.distributed.initialize would wait for it for minutes, deaf to SIGTERM, then abort
  with a C++ stack trace."""
  host, _, port = address.rpartition(":")
  host = host.strip("[]")  # [::1]:1234
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"--coordinator_address={address}: give HOST:PORT of process 0 "
                     f"(e.g. node0:1234)")
  try:
    socket.getaddrinfo(host, int(port))
  except OSError as e:
    raise ValueError(f"--coordinator_address={address}: cannot resolve {host} "
                     f"({e.strerror or e}); give the host name or address of process 0's "
                     f"machine") from None


def check_shape(shape: Sequence[int]) -> tuple[int, ...]:
  """mesh.shape as ints, refused in one line unless it is one positive size per axis with
  at most one -1 (a 0 would otherwise divide by zero in the batch checks)."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh.shape needs {len(MESH_AXES)} entries {MESH_AXES}, got {shape}")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh.shape {shape}: sizes must be positive, with at most one -1 (the "
                     f"devices' share)")
  return shape


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolve one -1 in `shape` and check that the product is the device count."""
  shape = check_shape(shape)
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh.shape {shape} does not divide the {num_devices} devices")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if int(np.prod(shape)) != num_devices:
    raise ValueError(f"mesh.shape {shape} has {int(np.prod(shape))} slots "
                     f"but there are {num_devices} devices")
  return shape


def cpu_device_count(shape: Sequence[int], batch_size: int, grad_accum_steps: int,
                     cores: int, processes: int = 1) -> int:
  """How many XLA:CPU devices to split a host's `cores` into: one per core, or the most that
  `shape` and the batch (split over data x fsdp, then into micro-batches) divide evenly
  when each of `processes` hosts does the same.

  XLA:CPU runs many of a Transformer's ops (attention's per-head products, softmaxes, norms)
  on one thread each; data parallelism over per-core devices gives every core its own
  stream of them (docs/performance.md)."""
  for n in range(cores, 1, -1):
    try:
      data, fsdp, _ = mesh_shape(shape, n * processes)
    except ValueError:
      continue
    if batch_size % (data * fsdp * grad_accum_steps) == 0:
      return n
  return 1


def make_mesh(shape: Sequence[int], batch_size: int = 0,
              grad_accum_steps: int = 1) -> jax.sharding.Mesh:
  """The mesh for `shape` over all devices; `batch_size` (if given) names the real problem
  when it is the batch that keeps `--cpu_devices=0` from splitting the host as asked."""
  check_shape(shape)  # not caught below: the batch check there divides by its entries
  try:
    shape = mesh_shape(shape, jax.device_count())
  except ValueError as e:
    fixed = tuple(int(s) for s in shape)
    if batch_size and len(fixed) == len(MESH_AXES) and -1 not in fixed:
      check_batch_size(batch_size, fixed, grad_accum_steps)
    if jax.default_backend() == "cpu":
      raise ValueError(f"{e}; on CPU, --cpu_devices=N splits the host into N devices") \
          from None
    raise
  # Auto axes: shardings are hints that XLA propagates, which is what the logical-axis
  # constraints in the model are written for.
  return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def data_parallel_size(mesh) -> int:
  """Batch rows are split this many ways; `mesh` may also be a resolved mesh shape."""
  sizes = dict(zip(MESH_AXES, mesh)) if isinstance(mesh, tuple) else mesh.shape
  return int(np.prod([sizes[a] for a in BATCH_AXES]))


@contextlib.contextmanager
def activate(mesh: jax.sharding.Mesh):
  """Context for tracing and running model code on `mesh`: it installs the mesh globally
  (jax.set_mesh), so the logical-axis constraints on activations in the model (Dense's
  outputs, attention's heads, the feed-forward's mlp) resolve through RULES into real
  sharding constraints instead of no-ops: the attention and feed-forward activations split
  by head and mlp unit as a rule rather than as XLA's propagation from the weights happens to
  choose, and the residual stream split by position, which propagation never does and which
  is most of what a tensor mesh saves per device (tests/sharding_test.py measures it).
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    yield


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int],
                    mesh: jax.sharding.Mesh) -> P:
  """Mesh PartitionSpec for an array with logical axis `names`.

  A dimension that the mesh axes do not divide stays unsplit (e.g. 2 kv heads on tensor=4),
  rather than failing: the run is slower on that weight but still correct.
  """
  used: set[str] = set()
  spec = []
  for name, size in zip(names, shape):
    choice = None
    for rule_name, axes in RULES:
      if rule_name != name or axes is None:
        continue
      axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
      if used & set(axes_t):
        continue
      if size % int(np.prod([mesh.shape[a] for a in axes_t])):
        continue
      choice = axes_t
      break
    if choice:
      used.update(choice)
      spec.append(choice[0] if len(choice) == 1 else choice)
    else:
      spec.append(None)
  return P(*spec)


def param_shardings(logical_names, abstract_params, mesh):
  """NamedShardings for a parameter tree from its logical names (a tree of PartitionSpecs)."""
  def one(names, param):
    return NamedSharding(mesh, logical_to_spec(tuple(names), param.shape, mesh))
  return jax.tree.map(one, logical_names, abstract_params,
                      is_leaf=lambda x: isinstance(x, P))


def like_params_shardings(abstract_tree, abstract_params, params_shardings, mesh):
  """Shardings for a tree holding copies of the parameters (optimizer moments), by path.

  A leaf whose key path ends with a parameter's path and has that parameter's shape is
  sharded like it; everything else (step counters, Adafactor's factored row/column
  statistics) is small and replicated.
  """
  by_path = {}
  for (path, param), sharding in zip(jax.tree_util.tree_leaves_with_path(abstract_params),
                                     jax.tree.leaves(params_shardings)):
    by_path[tuple(map(str, path))] = (param.shape, sharding)
  replicated = NamedSharding(mesh, P())

  def one(path, leaf):
    keys = tuple(map(str, path))
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == getattr(leaf, "shape", None):
        return hit[1]
    return replicated
  return jax.tree_util.tree_map_with_path(one, abstract_tree)


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def check_batch_size(batch_size: int, mesh, grad_accum_steps: int = 1) -> None:
  dp = data_parallel_size(mesh)
  if batch_size % (dp * grad_accum_steps):
    raise ValueError(
        f"train.batch_size={batch_size} is not divisible by the data-parallel size {dp} "
        f"(mesh data x fsdp) times opt.grad_accum_steps={grad_accum_steps}")
  if batch_size % jax.process_count():
    raise ValueError(f"train.batch_size={batch_size} is not divisible by the "
                     f"{jax.process_count()} processes")
  check_batch_groups(mesh)


def check_batch_groups(mesh) -> None:
  """Each process feeds its own rows (global_batch), so the devices that share a slice of the
  batch (one data x fsdp coordinate, across tensor) must all belong to one process. Otherwise
  jax.make_array_from_process_local_data takes the rows as replicated: the step trains on one
  process's rows as if they were the whole batch, and the processes disagree silently."""
  devices = getattr(mesh, "devices", None)
  if devices is None:  # a mesh shape, before the devices exist
    return
  groups = np.vectorize(lambda d: d.process_index)(devices)
  groups = groups.reshape(-1, groups.shape[-1])  # one row per batch slice
  if (groups != groups[:, :1]).any():
    raise ValueError(
        f"mesh {dict(mesh.shape)} puts the tensor axis across processes, so processes would "
        f"share batch rows; keep tensor within a host (at most its "
        f"{jax.local_device_count()} devices) and split hosts over data or fsdp")


def global_batch(local_batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """Assemble each host's rows into one batch-sharded global array per key."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in local_batch.items()}
