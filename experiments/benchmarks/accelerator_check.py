r"""The device check: one program, under 10 minutes on one GPU/TPU, a markdown table at the end.

    python -m experiments.benchmarks.accelerator_check [--out accelerator_check.md]
    python -m experiments.benchmarks.accelerator_check --smoke    # tiny shapes, CPU, < 1 min

1. attention   every accelerator implementation this backend has (GPU: cudnn, pallas_gpu;
               TPU: splash; CPU: structured_attention with implementation="xla", and splash /
               pallas_gpu in Pallas interpret mode) against `dense` on the same inputs:
               forward and gradients of sum(sin(out)) w.r.t. q, k, v, as the largest error
               over the largest reference value; causal, sliding window, packed segments,
               right padding, GQA. A refused case is listed with its reason. Also the time of
               a jitted forward + backward.
2. training    the real train step (`transformer.training.loop.build`, as
               train_throughput.py) of a ~350M-parameter decoder (d_model 1024, 24 layers,
               16 heads, d_ff 2560 SwiGLU, vocab 32000 untied: 355M, context 2048, batch 8) in bf16
               compute with float32 weights and AdamW state (schema.PRECISIONS["bf16"]):
               median step time, tokens/s, and MFU = flops_per_token * tokens/s over the
               device's published bf16 peak (throughput.PEAK_FLOPS; Kaplan's 6N + 6LTd).
3. decode      decode.generate with the KV cache, bf16 weights, a batch of prompts, greedy, no
               stop token: new tokens per second, prefill included.

--smoke shrinks every shape (a 2-layer d_model 64 model, context 128) so the whole program runs
on a CPU in well under a minute; its figures mean nothing, it checks the program
(tests/accelerator_check_test.py). MFU on CPU is against a measured float32 matmul peak.
"""

import functools
import os
import statistics
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli, schema
from transformer.analysis import model_stats
from transformer.inference import decode
from transformer.model import attention, models
from transformer.model.positions import AttentionTerms
from transformer.training import loop, sharding, throughput

_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes: a CPU check of the program.")
_OUT = flags.DEFINE_string("out", "accelerator_check.md", "Where the markdown table goes.")
_STEPS = flags.DEFINE_integer("steps", 0, "Timed training steps (0: 20, smoke 3).")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Training batch (0: 8, smoke 2).")
_ATTENTION = flags.DEFINE_string("attention", "auto", "model.attention for training/decode.")
PARTS = ("attention", "training", "decode")  # in the order they run
_SKIP = flags.DEFINE_list("skip", [], f"Parts to skip: {', '.join(PARTS)}.")

FULL = dict(
    attention=dict(B=2, L=1024, N=8, K=2, H=128, window=256, dtype="bfloat16", atol=2e-2),
    # 289M non-embedding + 66M embedding and output parameters: 355M.
    model=dict(vocab_size=32_000, d_model=1024, num_layers=24, num_heads=16, d_ff=2560,
               ffn="swiglu", tie_embeddings=False),
    seq_len=2048, batch_size=8, steps=20,
    decode=dict(batch=16, prompt=128, new_tokens=256),
)
SMOKE = dict(
    attention=dict(B=2, L=128, N=4, K=2, H=32, window=40, dtype="float32", atol=1e-4),
    model=dict(vocab_size=256, d_model=64, num_layers=2, num_heads=2, d_ff=128,
               ffn="swiglu", tie_embeddings=False),
    seq_len=128, batch_size=2, steps=3,
    decode=dict(batch=2, prompt=8, new_tokens=8),
)


def shapes():
  return SMOKE if _SMOKE.value else FULL


# ---------------------------------------------------------------------------------------------
# 1. Attention against dense.

def implementations(backend):
  structured = lambda q, k, v, lay, terms, *, scale, cfg: attention.structured_attention(
      q, k, v, lay, terms, scale=scale, implementation="xla")
  if backend == "gpu":
    return {"cudnn": attention.cudnn, "pallas_gpu": attention.pallas_gpu}
  if backend == "tpu":
    return {"splash": attention.splash}
  return {"structured (xla)": structured, "splash (interpret)": attention.splash,
          "pallas_gpu (interpret)": attention.pallas_gpu}


def attention_case(name, a, rng):
  B, L, N, K, H = a["B"], a["L"], a["N"], a["K"], a["H"]
  seg = np.ones((B, L), np.int32)
  kind = "single"
  if name in ("packed", "packed_gqa"):
    kind = "packed"
    seg[0, L // 3:] = 2
    seg[0, L * 7 // 8:] = 0
    seg[1, L // 2:] = 2
  if name == "right_padded":
    kind = "right_padded"
    seg[1, L * 2 // 3:] = 0
  pos = np.zeros_like(seg)
  for i in range(1, L):
    pos[:, i] = np.where(seg[:, i] == seg[:, i - 1], pos[:, i - 1] + 1, 0)
  arrays = {} if kind == "single" else dict(
      q_segments=jnp.asarray(seg), k_segments=jnp.asarray(seg),
      q_positions=jnp.asarray(pos), k_positions=jnp.asarray(pos))
  layout = attention.make_layout(L, L, batch=B, causal=name != "bidirectional",
                                 window=a["window"] if name == "window" else 0,
                                 segments=kind, **arrays)
  kv = K if name in ("packed_gqa", "window") else N
  dtype = jnp.dtype(a["dtype"])
  q, k, v = (jnp.asarray(rng.normal(size=(B, L, n, H)), dtype) for n in (N, kv, kv))
  return q, k, v, layout, AttentionTerms()


ATTENTION_CASES = ("causal", "bidirectional", "window", "right_padded", "packed", "packed_gqa")
SMOKE_CASES = ("window", "right_padded", "packed_gqa")  # every feature, fewer compilations


def first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"[:300].replace("|", "/")


def relative_error(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def attention_checks(backend) -> list[dict]:
  a = shapes()["attention"]
  cfg = schema.model_config()
  rows = []
  rng = np.random.default_rng(0)
  for case in SMOKE_CASES if _SMOKE.value else ATTENTION_CASES:
    q, k, v, layout, terms = attention_case(case, a, rng)
    scale = a["H"] ** -0.5
    f32 = lambda x: x.astype(jnp.float32)

    def loss(fn, q, k, v):
      out = fn(q, k, v, layout, terms, scale=scale, cfg=cfg)
      return jnp.sum(jnp.sin(out.astype(jnp.float32))), out

    grad_of = lambda fn: jax.jit(jax.value_and_grad(functools.partial(loss, fn), (0, 1, 2),
                                                    has_aux=True))
    # The reference sees the same (rounded) inputs, in float32.
    (_, ref), ref_grads = grad_of(attention.dense)(f32(q), f32(k), f32(v))
    for name, fn in implementations(backend).items():
      row = dict(case=case, implementation=name, dtype=a["dtype"])
      try:
        step = grad_of(fn)
        (_, out), grads = step(q, k, v)
        jax.block_until_ready(grads)
        times = []
        for _ in range(3):
          start = time.perf_counter()
          jax.block_until_ready(step(q, k, v))
          times.append(time.perf_counter() - start)
        err = max([relative_error(out, ref)] +
                  [relative_error(g, r) for g, r in zip(grads, ref_grads)])
        row.update(error=err, ok=err <= a["atol"], ms=statistics.median(times) * 1e3)
      except ValueError as e:  # a clear refusal
        row.update(refused=str(e).split(": ", 1)[-1])
      except Exception as e:  # pylint: disable=broad-except
        # A crash (a kernel that fails to lower, say) is a finding, not the end of the check.
        row.update(failed=first_line(e), ok=False)
      rows.append(row)
  return rows


# ---------------------------------------------------------------------------------------------
# 2. Training throughput in bf16.

def model_cfg(s, **overrides):
  return schema.model_config(kind="decoder", max_len=s["seq_len"] + s["decode"]["new_tokens"]
                             + s["decode"]["prompt"], attention=_ATTENTION.value,
                             **s["model"], **overrides)


def published_peak() -> tuple[float, str]:
  kind = jax.devices()[0].device_kind
  peak = throughput.PEAK_FLOPS.get(kind) or next(
      (v for k, v in throughput.PEAK_FLOPS.items() if kind.startswith(k)), 0.0)
  if peak:
    return peak, f"{kind} published bf16 peak"
  return throughput.measure_matmul_peak(512 if _SMOKE.value else 4096), \
      f"{kind}: no published peak; measured float32 matmul"


def training_check() -> dict:
  s = shapes()
  B = _BATCH.value or s["batch_size"]
  L = s["seq_len"]
  model = model_cfg(s, **schema.precision_config("bf16"))
  data = schema.ml_collections.ConfigDict(dict(seq_len=L))
  config = schema.experiment_config(model, data, schema.objective_config("lm"),
                                    batch_size=B, steps=1000)
  config.opt.name = "adamw"
  mesh = sharding.make_mesh(config.mesh.shape)
  built = loop.build(config, mesh)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model.vocab_size, (B, L + 1), dtype=np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": np.ones((B, L), np.int32),
           "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy(),
           "weights": np.ones((B, L), np.float32)}
  with sharding.activate(mesh):
    state = jax.jit(built.init, out_shardings=built.state_shardings)(0)
    batch = sharding.global_batch(batch, mesh)
    start = time.perf_counter()
    compiled = built.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
  state, metrics = compiled(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(_STEPS.value or s["steps"]):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  total, non_embedding = model_stats.param_totals(built.param_shapes)
  per_token = throughput.flops_per_token(model, L, non_embedding)
  step_s = statistics.median(times)
  peak, peak_source = published_peak()
  # What this chip's matmul really reaches in bf16 (a GPU's published peak is rarely reached):
  # MFU against both says how much of the gap is the step and how much the chip.
  matmul = throughput.measure_matmul_peak(512 if _SMOKE.value else 8192, dtype=jnp.bfloat16)
  tokens_per_s = B * L / step_s
  q = jax.ShapeDtypeStruct((B, L, model.num_heads, model.d_model // model.num_heads),
                           jnp.bfloat16)
  layout = attention.make_layout(L, L, batch=B, q_segments=jnp.ones((B, L), jnp.int32),
                                 k_segments=jnp.ones((B, L), jnp.int32), causal=True)
  chosen = attention.choose(jax.default_backend(), q, q, layout, AttentionTerms())
  return dict(params=total, non_embedding=non_embedding, batch=B, seq_len=L,
              step_ms=step_s * 1e3, tokens_per_s=tokens_per_s, compile_s=compile_s,
              mfu=per_token * tokens_per_s / (peak * jax.device_count()),
              matmul=matmul, mfu_matmul=per_token * tokens_per_s / (matmul * jax.device_count()),
              peak=peak, peak_source=peak_source, loss=float(metrics["loss"]),
              attention=_ATTENTION.value + (f" -> {chosen}" if _ATTENTION.value == "auto"
                                            else ""))


# ---------------------------------------------------------------------------------------------
# 3. Decode throughput with the KV cache.

def decode_check() -> dict:
  s = shapes()
  d = s["decode"]
  cfg = model_cfg(s, dtype="bfloat16", param_dtype="bfloat16")
  model = decode.frozen(models.make_model(cfg))
  params = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))()
  params = params["params"]
  rng = np.random.default_rng(0)
  prompts = rng.integers(4, cfg.vocab_size, (d["batch"], d["prompt"])).tolist()
  run = lambda: decode.generate(model, params, prompts, max_new_tokens=d["new_tokens"],
                                stop_tokens=())
  start = time.perf_counter()
  run()
  first_s = time.perf_counter() - start
  times = []
  for _ in range(3):
    start = time.perf_counter()
    out = run()
    times.append(time.perf_counter() - start)
  assert out.shape == (d["batch"], d["new_tokens"])
  t = statistics.median(times)
  return dict(batch=d["batch"], prompt=d["prompt"], new_tokens=d["new_tokens"], seconds=t,
              tokens_per_s=d["batch"] * d["new_tokens"] / t, first_s=first_s)


# ---------------------------------------------------------------------------------------------

def markdown(header, attn, train, dec) -> str:
  lines = [f"# Accelerator check{' (smoke: tiny shapes, figures mean nothing)' if _SMOKE.value else ''}",
           "", header, ""]
  if attn is not None:
    lines += ["## Attention against dense (forward and gradients)", "",
              "| case | implementation | dtype | max error / max reference | ok | fwd+bwd ms |",
              "| --- | --- | --- | ---: | --- | ---: |"]
    for r in attn:
      if "refused" in r:
        lines.append(f"| {r['case']} | {r['implementation']} | {r['dtype']} | refused: "
                     f"{r['refused']} | - | - |")
      elif "failed" in r:
        lines.append(f"| {r['case']} | {r['implementation']} | {r['dtype']} | failed: "
                     f"{r['failed']} | **NO** | - |")
      else:
        lines.append(f"| {r['case']} | {r['implementation']} | {r['dtype']} | {r['error']:.2e} "
                     f"| {'yes' if r['ok'] else '**NO**'} | {r['ms']:.2f} |")
    lines.append("")
  if isinstance(train, str):
    lines += ["## Training step, bf16 compute, fp32 weights and AdamW", "", f"failed: {train}", ""]
  elif train is not None:
    lines += ["## Training step, bf16 compute, fp32 weights and AdamW", "",
              "| params | batch x context | attention | step ms | tokens/s | MFU | peak | "
              "bf16 matmul measured | MFU vs measured | compile s | loss |",
              "| ---: | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
              f"| {train['params'] / 1e6:.1f}M ({train['non_embedding'] / 1e6:.1f}M non-emb.) "
              f"| {train['batch']} x {train['seq_len']} | {train['attention']} "
              f"| {train['step_ms']:.1f} | {train['tokens_per_s']:,.0f} | {train['mfu']:.1%} "
              f"| {train['peak'] / 1e12:.1f} TFLOP/s ({train['peak_source']}) "
              f"| {train['matmul'] / 1e12:.1f} TFLOP/s | {train['mfu_matmul']:.1%} "
              f"| {train['compile_s']:.1f} | {train['loss']:.3f} |", ""]
  if isinstance(dec, str):
    lines += ["## Decode with the KV cache, bf16 weights, greedy", "", f"failed: {dec}", ""]
  elif dec is not None:
    lines += ["## Decode with the KV cache, bf16 weights, greedy", "",
              "| batch | prompt | new tokens | seconds | new tokens/s | first call s |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |",
              f"| {dec['batch']} | {dec['prompt']} | {dec['new_tokens']} | {dec['seconds']:.3f} "
              f"| {dec['tokens_per_s']:,.0f} | {dec['first_s']:.1f} |", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  unknown = sorted(set(_SKIP.value) - set(PARTS))
  if unknown:
    raise ValueError(f"--skip={','.join(unknown)}: valid parts are {', '.join(PARTS)}")
  start = time.perf_counter()
  backend = jax.default_backend()
  header = (f"{jax.devices()[0].device_kind} x{jax.device_count()} ({backend}), "
            f"jax {jax.__version__}, {os.cpu_count()} CPUs")
  print(header, flush=True)
  parts = dict.fromkeys(PARTS)
  checks = {"attention": lambda: attention_checks(backend), "training": training_check,
            "decode": decode_check}

  def write():  # after every part, so a cut run still leaves what it measured
    text = markdown(header + f"; {time.perf_counter() - start:.0f} s in all",
                    parts["attention"], parts["training"], parts["decode"])
    with open(_OUT.value, "w") as f:
      f.write(text + "\n")
    return text

  for name, check in checks.items():
    if name in _SKIP.value:
      continue
    try:
      parts[name] = check()
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      parts[name] = first_line(e) if name != "attention" else [dict(
          case="-", implementation="-", dtype="-", failed=first_line(e), ok=False)]
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    write()
  print(write())
  failed = [n for n, v in parts.items() if isinstance(v, str)]
  if parts["attention"] is not None and any(r.get("ok") is False for r in parts["attention"]):
    failed.insert(0, "attention (an implementation disagrees with dense or failed)")
  if failed:
    raise SystemExit(f"error: the check failed in {', '.join(failed)} (table and log above)")


if __name__ == "__main__":
  cli.run(main)
