"""Meshes, logical-axis rules, and on 8 (fake CPU) devices: 3 training steps under data,
fsdp and tensor meshes give the one-device losses, and the compiled step of a tensor mesh
splits the activations (by head, mlp unit and, between sub-layers, position) while an fsdp
mesh splits the parameters and optimizer state, as XLA's memory analysis counts them."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from helpers import tiny_run
from transformer.training import sharding, loop

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]


class FakeMesh:
  def __init__(self, data, fsdp, tensor):
    self.shape = {"data": data, "fsdp": fsdp, "tensor": tensor}


def test_mesh_shape_fills_one_minus_one_and_explains_mistakes():
  assert sharding.mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
  assert sharding.mesh_shape([2, 2, 2], 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="has 4 slots but there are 8 devices"):
    sharding.mesh_shape((2, 2, 1), 8)
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.mesh_shape((-1, -1, 1), 8)
  with pytest.raises(ValueError, match="needs 3 entries"):
    sharding.mesh_shape((8,), 8)
  with pytest.raises(ValueError, match="does not divide the 8 devices"):
    sharding.mesh_shape((3, -1, 1), 8)


def test_rules_map_weights_and_activations():
  mesh = FakeMesh(2, 2, 2)
  assert sharding.logical_to_spec(("embed", "mlp"), (64, 256), mesh) == P("fsdp", "tensor")
  assert sharding.logical_to_spec(("vocab", "embed"), (260, 64), mesh) == P("tensor", "fsdp")
  # The batch takes data and fsdp, so the activations' embed dimension stays whole.
  assert (sharding.logical_to_spec(("batch", "length", "embed"), (8, 32, 64), mesh)
          == P(("data", "fsdp"), None, None))
  # Not divisible: left unsplit rather than failing (3 kv heads on tensor=2).
  assert (sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 3, 16), mesh)
          == P("fsdp", None, None))
  assert sharding.logical_to_spec(("layers", "embed"), (4, 64), mesh) == P(None, "fsdp")


def test_activation_constraints_split_what_the_mesh_divides():
  import flax.linen as nn
  import jax.numpy as jnp
  from jax.sharding import AbstractMesh, AxisType
  from transformer.model.dense import constrain

  def spec(shape, names, mesh_shape=(1, 2, 8)):
    mesh = AbstractMesh(mesh_shape, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(sharding.RULES):
      eqns = jax.make_jaxpr(lambda x: constrain(x, names))(jnp.zeros(shape)).jaxpr.eqns
    return eqns[0].params["sharding"].spec
  heads = ("batch", "length", "heads", "head_dim")
  assert spec((8, 16, 8, 32), heads) == P(("data", "fsdp"), None, "tensor", None)
  # 4 heads do not split 8 ways: whole, as their weights are (logical_to_spec).
  assert spec((8, 16, 4, 32), heads) == P(("data", "fsdp"), None, None, None)
  assert (spec((8, 16, 64), ("batch", "residual_length", "embed"))
          == P(("data", "fsdp"), "tensor", None))
  assert spec((8, 16, 1024), ("batch", "length", "mlp")) == P(("data", "fsdp"), None, "tensor")
  # Outside sharding.activate (no mesh, no rules): no constraint at all.
  assert not jax.make_jaxpr(lambda x: constrain(x, heads))(jnp.zeros((8, 16, 8, 32))).eqns


def test_batch_size_must_divide_over_the_data_parallel_devices():
  mesh = FakeMesh(2, 4, 1)
  with pytest.raises(ValueError, match="train.batch_size=12 is not divisible by the "
                                       "data-parallel size 8"):
    sharding.check_batch_size(12, mesh)


def test_the_tensor_axis_may_not_span_processes():
  # Devices sharing a batch slice (one data x fsdp coordinate) must belong to one process:
  # otherwise each process's rows would be taken as the whole, replicated batch.
  class Device:
    def __init__(self, process_index):
      self.process_index = process_index

  def mesh(data, fsdp, tensor, per_process):
    ids = np.arange(data * fsdp * tensor).reshape(data, fsdp, tensor) // per_process
    m = FakeMesh(data, fsdp, tensor)
    m.devices = np.vectorize(Device, otypes=[object])(ids)
    return m

  sharding.check_batch_groups(mesh(2, 1, 2, per_process=2))  # tensor within a host
  sharding.check_batch_groups(mesh(2, 2, 1, per_process=1))  # one device per process
  for bad in (mesh(1, 1, 2, per_process=1), mesh(1, 2, 4, per_process=2)):
    with pytest.raises(ValueError, match="puts the tensor axis across processes"):
      sharding.check_batch_groups(bad)


def test_a_mesh_that_does_not_fit_names_the_batch_or_the_cpu_flag():
  # One device here; a (2, 1, 1) mesh would need --cpu_devices=2, unless the batch is what
  # kept --cpu_devices=0 from making two.
  with pytest.raises(ValueError, match=r"train.batch_size=3 is not divisible by the "
                                       r"data-parallel size 2"):
    sharding.make_mesh((2, 1, 1), batch_size=3)
  with pytest.raises(ValueError, match=r"has 2 slots but there are 1 devices; on CPU, "
                                       r"--cpu_devices=N splits the host"):
    sharding.make_mesh((2, 1, 1), batch_size=4)


@pytest.mark.parametrize("shape,batch,accum,cores,processes,want", [
    ((-1, 1, 1), 16, 1, 2, 1, 2),   # one device per core
    ((-1, 1, 1), 3, 1, 2, 1, 1),    # an odd batch cannot be split in two
    ((-1, 1, 1), 6, 1, 4, 1, 3),    # the most that divide: 3 of 4 cores
    ((-1, 1, 1), 6, 2, 4, 1, 3),    # micro-batches of 3 rows, one per device
    ((1, 1, 1), 16, 1, 8, 1, 1),    # a fixed one-device mesh stays one device
    ((2, -1, 1), 16, 1, 3, 1, 2),   # 3 devices do not fill a (2, x) mesh
    ((-1, 1, 1), 4, 1, 2, 2, 2),    # 2 hosts x 2 devices, 4 rows: one each
    ((-1, 1, 1), 2, 1, 2, 2, 1),
])
def test_cpu_device_count(shape, batch, accum, cores, processes, want):
  assert sharding.cpu_device_count(shape, batch, accum, cores, processes) == want


def test_cpu_device_count_is_the_largest_that_fits():
  rng = np.random.default_rng(0)
  for _ in range(200):
    shape = [int(rng.choice([-1, 1, 2])) for _ in range(3)]
    if shape.count(-1) > 1:
      shape[shape.index(-1)] = 1
    batch, accum, cores = (int(x) for x in rng.integers(1, 13, size=3))
    n = sharding.cpu_device_count(shape, batch, accum, cores)

    def fits(count):
      try:
        data, fsdp, _ = sharding.mesh_shape(shape, count)
      except ValueError:
        return False
      return batch % (data * fsdp * accum) == 0
    assert 1 <= n <= max(cores, 1)
    assert n == 1 or fits(n)
    assert not any(fits(m) for m in range(n + 1, cores + 1))


def test_meshes_on_eight_devices_match_one_device(tmp_path):
  env = dict(os.environ)
  data_dir = str(tmp_path / "tfds")
  one = loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(tmp_path / "one"))
  assert one["step"] == 3
  reference = tiny_run.losses(str(tmp_path / "one"))

  script = f"""
import json, sys
sys.path.insert(0, {HERE!r})
import jax
from helpers import tiny_run
from transformer.training import loop
assert jax.device_count() == 8, jax.devices()
out = {{}}
for mesh in {MESHES!r}:
  workdir = {str(tmp_path)!r} + "/mesh" + "x".join(map(str, mesh))
  config = tiny_run.tiny_config({data_dir!r}, **{{"mesh.shape": mesh}})
  loop.train_and_evaluate(config, workdir)
  out[str(mesh)] = tiny_run.losses(workdir)
print(json.dumps(out))
"""
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        env=env, timeout=900, cwd=os.path.dirname(HERE))
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(proc.stdout.strip().splitlines()[-1])
  for mesh in MESHES:
    got = {int(k): v for k, v in results[str(mesh)].items()}
    np.testing.assert_allclose([got[s] for s in (1, 2, 3)], [reference[s] for s in (1, 2, 3)],
                               atol=1e-5, rtol=0, err_msg=f"mesh {mesh}")


# d_model 256, 8 heads of 32, d_ff 1024, 256 tokens x 8 rows: activations dominate the step.
MEMORY_SCRIPT = """
import json, sys
import jax, numpy as np
from jax.sharding import Mesh
from transformer import schema
from transformer.training import loop, sharding
assert jax.device_count() == 8, jax.devices()
model = schema.model_config(kind="decoder", vocab_size=256, ffn="gelu", max_len=256,
                            position=schema.position_config("learned"), d_model=256,
                            num_layers=2, num_heads=8, d_ff=1024)
config = schema.experiment_config(model, schema.ml_collections.ConfigDict(dict(seq_len=256)),
                                  schema.objective_config("lm"), batch_size=8, steps=10)
config.opt.name = "adamw"
tokens = np.random.default_rng(0).integers(0, 256, (8, 257), dtype=np.int32)
batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
         "segment_ids": np.ones((8, 256), np.int32),
         "positions": np.broadcast_to(np.arange(256, dtype=np.int32), (8, 256)).copy(),
         "weights": np.ones((8, 256), np.float32)}
out = {}
for shape in [(1, 1, 1), (1, 1, 8), (1, 8, 1)]:
  devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
  mesh = Mesh(devices, sharding.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
  built = loop.build(config, mesh)
  state_bytes = sum(int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize
                    for a in jax.tree.leaves(built.abstract_state))
  with sharding.activate(mesh):
    state = jax.jit(built.init, out_shardings=built.state_shardings)(0)
    global_batch = sharding.global_batch(batch, mesh)
    compiled = built.train_step.lower(state, global_batch).compile()
    losses = []
    for _ in range(2):
      state, metrics = compiled(state, global_batch)
      losses.append(float(metrics["loss"]))
  memory = compiled.memory_analysis()
  out[str(shape)] = dict(temp=memory.temp_size_in_bytes,
                         argument=memory.argument_size_in_bytes, state=state_bytes,
                         losses=losses, hlo=compiled.as_text())
print(json.dumps(out))
"""


def test_tensor_mesh_splits_activations_and_fsdp_splits_the_state():
  env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True,
                        env=env, timeout=900, cwd=os.path.dirname(HERE))
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  one, tensor, fsdp = got["(1, 1, 1)"], got["(1, 1, 8)"], got["(1, 8, 1)"]
  for name, run in (("tensor", tensor), ("fsdp", fsdp)):
    np.testing.assert_allclose(run["losses"], one["losses"], atol=1e-5, rtol=0, err_msg=name)
  # Activations and temporaries per device: several-fold less on the tensor mesh.
  assert tensor["temp"] * 3 < one["temp"], (tensor["temp"], one["temp"])
  # Parameters and optimizer state per device: 1/8 on the fsdp mesh, up to the few small
  # vectors that 'embed' does not name (mlp biases).
  assert one["state"] / 8 <= fsdp["state"] < one["state"] / 8 * 1.05, (fsdp["state"],
                                                                       one["state"])
  # The programs themselves: on the tensor mesh each device holds 1 of the 8 heads of the
  # queries [2048 tokens, heads, 32], 128 of the 1024 mlp units, and between sub-layers 32 of
  # the 256 positions of the residual stream [8, 256, 256]; one device holds them whole.
  def has(run, *shapes):
    return any(f"f32[{s}]" in run["hlo"] for s in shapes)
  heads = lambda n: (f"2048,{n},32", f"8,256,{n},32")
  assert has(one, *heads(8)) and has(one, "2048,1024") and has(one, "8,256,256")
  assert has(tensor, *heads(1)) and not has(tensor, *heads(8))
  assert has(tensor, "2048,128") and not has(tensor, "2048,1024")
  assert has(tensor, "8,32,256")


@pytest.mark.parametrize("shape", [(0, 1, 1), (1, -2, 1), (-1, 1, 0)])
def test_a_zero_or_negative_mesh_entry_is_refused_before_any_batch_check(shape):
  with pytest.raises(ValueError, match=r"sizes must be positive, with at most one -1"):
    sharding.make_mesh(shape, batch_size=8)  # was: ZeroDivisionError in check_batch_size
  config = tiny_run.tiny_config("unused", **{"mesh.shape": shape})
  with pytest.raises(ValueError, match=r"sizes must be positive"):
    loop.check_config(config)


def test_kv_heads_split_over_tensor_where_it_divides_them():
  """GQA's key/value kernels split by kv head on the tensor axis, as the query heads do."""
  mesh = FakeMesh(2, 2, 2)
  assert (sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 4, 16), mesh)
          == P("fsdp", "tensor", None))
  assert (sharding.logical_to_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh)
          == P("fsdp", "tensor", None))


MESH_SCRIPT = """
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from transformer.training import sharding
assert jax.device_count() == 8, jax.devices()
mesh = sharding.make_mesh((2, 4, 1))
assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}, dict(mesh.shape)
assert dict(sharding.make_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "tensor": 1}
assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp")), sharding.batch_sharding(mesh)
x = sharding.global_batch({"inputs": np.arange(16 * 3).reshape(16, 3)}, mesh)["inputs"]
assert {s.data.shape for s in x.addressable_shards} == {(2, 3)}
print("ok")
"""


def test_make_mesh_names_its_axes_in_order_and_the_batch_splits_over_data_and_fsdp():
  """mesh.shape (data, fsdp, tensor) in that order, and batch rows split over data x fsdp
  (a batch split over data only would still train to the same losses, unnoticed)."""
  env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True,
                        env=env, timeout=300, cwd=os.path.dirname(HERE))
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_optimizer_state_of_another_shape_is_replicated():
  """A moment at a parameter's path and of its shape is sharded like the parameter; Adafactor's
  factored statistics sit at the same path with another shape and are replicated (the
  parameter's spec would not fit them)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), sharding.MESH_AXES)
  leaf = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  params = {"dense": {"kernel": leaf(8, 4)}}
  shardings = {"dense": {"kernel": NamedSharding(mesh, P("fsdp", "tensor"))}}
  state = {"mu": {"dense": {"kernel": leaf(8, 4)}}, "v_row": {"dense": {"kernel": leaf(8)}},
           "count": jax.ShapeDtypeStruct((), jnp.int32)}
  got = sharding.like_params_shardings(state, params, shardings, mesh)
  assert got["mu"]["dense"]["kernel"].spec == P("fsdp", "tensor")
  assert got["v_row"]["dense"]["kernel"].spec == P()
  assert got["count"].spec == P()
