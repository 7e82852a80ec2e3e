r"""Training throughput of the real train step on two fixed decoder workloads, fp32, CPU.

    python -m experiments.benchmarks.train_throughput [--workloads W1,W2] [--steps 10]
        [--attention auto] [--mesh data,fsdp,tensor --cpu_devices N]

    python -m experiments.benchmarks.train_throughput --workloads W1 --cpu_devices=8 --mesh=1,1,8

W1: vocab 256, d_model 256, 4 layers, 4 heads, d_ff 1024 (GELU), learned positions,
    context 256, batch 16, AdamW.
W2: vocab 256, d_model 512, 8 layers, 8 heads, d_ff 2048 (GELU), learned positions,
    context 512, batch 8, AdamW.

The step is `transformer.training.loop.build(config, mesh).train_step` (model, loss, AdamW
update) jitted with donation and sharded over the mesh, exactly what the train command runs, on random byte
tokens. The CPU is split into one XLA device per core, data-parallel (the train command's
--cpu_devices=0; --cpu_devices=1 measures its default, one device using every core).
Reported:
  step time   median of --steps timed steps after compilation and one warm-up step (with
              --window W: the median of the means of consecutive windows of W steps, the
              estimator of the train command's logged step time; also the best step, and
              the process CPU time per step: on a shared machine the wall time includes
              waiting for other processes, the CPU time does not)
  model FLOP/s = flops_per_token * tokens / step time, with
               flops_per_token = 6*N + 6*L*T*d_attn   (N: non-embedding params, L layers,
               T context, d_attn = heads * head_dim; Kaplan et al., as transformer.inspect)
               The output projection (6*V*d per token, ~2% of W1) is not counted, so the
               ratio is slightly conservative.
  of peak     model FLOP/s over the fp32 jnp.dot peak measured in the same process (best of
              five 2048^3 matmuls, before and after the workloads; the larger reading), so
              both sides see the same machine and thread count.
  compile     seconds to lower and compile the step.
  memory      XLA's buffer accounting of the compiled step (arguments + temporaries, summed
              over the devices) and the process's peak resident set; and per device (one
              device's program, what a tensor or fsdp mesh divides): its arguments (state
              and batch), outputs, temporaries (activations kept for the backward pass,
              gradients, workspace) and their total, arguments + outputs - the outputs
              donated into argument buffers + temporaries.
  --mesh      the mesh shape (data, fsdp, tensor; -1: the remaining devices), e.g. 1,1,8
              with --cpu_devices=8 for tensor parallelism over 8 XLA:CPU devices, 1,8,1 for
              fsdp. Default: the train command's, -1,1,1 (data-parallel).
  faults      minor page faults per timed step (median): memory the step got back from the
              kernel. The train command, and this benchmark unless --noretain_host_memory,
              keep freed memory in the process (transformer.host_memory), which makes it ~0.
"""

import os
import platform
import resource
import statistics
import time

import jax
import numpy as np
from absl import flags

from transformer import cli, schema
from experiments import results as experiment_results
from transformer.analysis import model_stats
from transformer.cpu import fused_attention
from transformer.training import loop, sharding, throughput
# The workloads and --workloads, --steps, --window, --peak_n, shared with the PyTorch run.
from experiments.benchmarks.workloads import (  # noqa: F401 (WORKLOADS: this module's API too)
    PEAK_N as _PEAK_N, STEPS as _STEPS, WINDOW as _WINDOW, WORKLOADS, WORKLOADS_FLAG as
    _WORKLOADS, check_window, window_median)

# One XLA:CPU device per core, data-parallel (the train command's --cpu_devices=0); pass
# --cpu_devices=1 for the train command's default, one device using every core.
cli.define_train_flags()
flags.FLAGS.set_default("cpu_devices", 0)
_MESH = flags.DEFINE_list("mesh", ["-1", "1", "1"],
                          "Mesh shape data,fsdp,tensor (-1: the remaining devices).")
_ATTENTION = flags.DEFINE_string(
    "attention", "auto", "model.attention for both workloads (e.g. query_blocks to compare "
    "XLA's blockwise attention with auto's fused CPU kernel).")


def workload_model(name: str):
  """The workload's model config (attention `auto`; experiment() applies --attention)."""
  w = WORKLOADS[name]
  return schema.model_config(kind="decoder", vocab_size=256, ffn="gelu", max_len=w["seq_len"],
                             position=schema.position_config("learned"), **w["model"])


def experiment(name: str):
  w = WORKLOADS[name]
  model = workload_model(name)
  data = schema.ml_collections.ConfigDict(dict(seq_len=w["seq_len"]))
  config = schema.experiment_config(model, data, schema.objective_config("lm"),
                                    batch_size=w["batch_size"], steps=1000)
  config.opt.name = "adamw"
  config.model.attention = _ATTENTION.value
  config.mesh.shape = mesh_flag()
  return config


def mesh_flag() -> tuple[int, ...]:
  try:
    shape = tuple(int(s) for s in _MESH.value)
  except ValueError:
    shape = ()
  if len(shape) != len(sharding.MESH_AXES):
    raise ValueError(f"--mesh={','.join(_MESH.value)}: give {len(sharding.MESH_AXES)} "
                     f"integers {','.join(sharding.MESH_AXES)}, e.g. --mesh=1,1,8")
  return shape


def random_batch(config, seed=0):
  rng = np.random.default_rng(seed)
  B, L = config.train.batch_size, config.data.seq_len
  tokens = rng.integers(0, 256, (B, L + 1), dtype=np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "segment_ids": np.ones((B, L), np.int32),
          "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy(),
          "weights": np.ones((B, L), np.float32)}


def measure(name: str) -> dict:
  config = experiment(name)
  # Built, sharded and jitted exactly as train_and_evaluate does (on CPU: one device per core).
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size)
  built = loop.build(config, mesh)
  shapes = built.param_shapes
  with sharding.activate(mesh):
    state = jax.jit(built.init, out_shardings=built.state_shardings)(0)
    batch = sharding.global_batch(random_batch(config), mesh)
    start = time.perf_counter()
    compiled = built.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
  memory = compiled.memory_analysis()
  state, metrics = compiled(state, batch)  # warm-up: first-touch allocations
  jax.block_until_ready(metrics)
  times, cpu_times, faults = [], [], []
  for _ in range(_STEPS.value):
    start, cpu_start = time.perf_counter(), time.process_time()
    faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    cpu_times.append(time.process_time() - cpu_start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start)

  _, non_embedding = model_stats.param_totals(shapes)
  flops_per_token = throughput.flops_per_token(config.model, config.data.seq_len,
                                               non_embedding)
  tokens = config.train.batch_size * config.data.seq_len
  step_s = window_median(times, _WINDOW.value)
  flops = flops_per_token * tokens / step_s
  # The compiled program is one device's; every local device runs a copy.
  xla_bytes = ((memory.argument_size_in_bytes + memory.temp_size_in_bytes)
               * jax.local_device_count() if memory else 0)
  per_device = {}
  if memory:
    per_device = dict(argument=memory.argument_size_in_bytes,
                      output=memory.output_size_in_bytes, temp=memory.temp_size_in_bytes)
    per_device["total"] = (per_device["argument"] + per_device["output"]
                           - memory.alias_size_in_bytes + per_device["temp"])
  return dict(workload=name, mesh=dict(mesh.shape), per_device=per_device, step_ms=step_s * 1e3, tokens_per_s=tokens / step_s,
              best_ms=min(times) * 1e3, cpu_ms=statistics.median(cpu_times) * 1e3,
              faults=statistics.median(faults),
              gflops=flops / 1e9, compile_s=compile_s,
              xla_mib=xla_bytes / 2**20, params_non_embedding=non_embedding,
              flops_per_token=flops_per_token, loss=float(metrics["loss"]))


def main(argv):
  del argv
  for name in _WORKLOADS.value:
    if name not in WORKLOADS:
      raise ValueError(f"unknown workload {name!r}; valid: {sorted(WORKLOADS)}")
  check_window(_WINDOW.value, _STEPS.value)
  # --retain_host_memory and --cpu_devices, as the train command applies them.
  retained = loop.configure_host([experiment(name) for name in _WORKLOADS.value],
                                 **cli.host_settings())
  for name in _WORKLOADS.value:  # a --mesh the devices do not fill: an error before compute
    config = experiment(name)
    sharding.make_mesh(config.mesh.shape, config.train.batch_size)
  print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"({experiment_results.cpu_model()}), {jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"jax {jax.__version__}; load average {os.getloadavg()[0]:.1f}; freed host memory "
        f"{'retained' if retained else 'returned to the kernel'}")
  why_not = fused_attention.unavailable()
  print(f"model.attention={_ATTENTION.value!r}" + (
      "" if _ATTENTION.value != "auto" else
      " -> fused_cpu (transformer/cpu/fused_attention.cc)" if why_not is None else
      f" -> query_blocks ({why_not})"))
  peak_before = throughput.measure_matmul_peak(_PEAK_N.value, repeats=5)
  results = [measure(name) for name in _WORKLOADS.value]
  peak_after = throughput.measure_matmul_peak(_PEAK_N.value, repeats=5)
  # Other processes on a shared machine only ever slow a measurement down, so the larger of
  # the two readings is the better estimate of what the hardware can do.
  peak = max(peak_before, peak_after)
  print(f"fp32 jnp.dot peak ({_PEAK_N.value}^3, best of 5): {peak_before / 1e9:.1f} GFLOP/s "
        f"before, {peak_after / 1e9:.1f} after the workloads; ratios use {peak / 1e9:.1f}")
  print(f"{'':4} {'step ms':>8} {'best ms':>8} {'cpu ms':>7} {'tokens/s':>9} {'GFLOP/s':>8} "
        f"{'of peak':>8} {'compile s':>9} {'XLA MiB':>8} {'faults':>7}  flops/token")
  for r in results:
    print(f"{r['workload']:4} {r['step_ms']:8.1f} {r['best_ms']:8.1f} {r['cpu_ms']:7.0f} "
          f"{r['tokens_per_s']:9.0f} {r['gflops']:8.1f} {r['gflops'] * 1e9 / peak:8.1%} "
          f"{r['compile_s']:9.1f} {r['xla_mib']:8.0f} {r['faults']:7.0f}  "
          f"{r['flops_per_token']:,} (N={r['params_non_embedding']:,})")
  print("per-device memory of the compiled step (XLA memory analysis), MiB:")
  print(f"{'':4} {'mesh':>24} {'argument':>9} {'output':>8} {'temp':>8} {'total':>8}")
  for r in results:
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    if r["per_device"]:
      m = {k: v / 2**20 for k, v in r["per_device"].items()}
      print(f"{r['workload']:4} {mesh:>24} {m['argument']:9.1f} {m['output']:8.1f} "
            f"{m['temp']:8.1f} {m['total']:8.1f}")
    else:
      print(f"{r['workload']:4} {mesh:>24} (no memory analysis on this backend)")
  print(f"process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB;"
        f" load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
  cli.run(main)
