"""Generation speed with and without the KV cache, and against Hugging Face `generate`.

  python -m experiments.benchmarks.generation [--new_tokens 128,256,512,1024] [--prompt 16] \
      [--hf_new_tokens 256,1024,4096] [--batches 1,8] [--repeats 3] [--cpu_devices 0] [--nohf] \
      [--quick] [--cache_dtype float32]

W1: vocab 256, d_model 256, 4 layers, 4 heads, d_ff 1024 GELU, learned positions (max_len
covers prompt + new tokens), fp32, greedy, no stop token (every run makes exactly T tokens).
--cache_dtype bfloat16 stores our KV cache in bfloat16 (model.cache_dtype; HF's stays fp32).

  cache     decode.generate: one prefill, then one step per token (a lax.while_loop) that
            computes the new token's query/key/value and attends to the filled cache slots
  recompute the full forward pass for every new token over a fixed [1, prompt + T] buffer
            (the not-yet-generated part is masked by causality, so one compiled program
            serves every step); logits are read at the last real position

Both produce the same tokens (checked). With the cache the matmul work per token is fixed
and only attention grows with the cache length, so the total grows ~linearly in T; without it
every token pays a full pass over prompt + T positions, so the total grows ~quadratically.
Compilation is excluded: the cached path is warmed up once, the recompute path compiled ahead.

Then, on the same shape in GPT-2 form (LayerNorm, biases, tanh GELU; needs the interop extra):
a random-weight transformers GPT2LMHeadModel, converted to this project's parameters by
transformer.interop.hf.from_hf, decodes the same prompts greedily with both libraries,
batches of --batches rows, for each of --hf_new_tokens:

  ours  decode.generate (one compiled program per length, warmed up first)
  hf    model.generate(do_sample=False, use_cache=True), eager torch with --threads threads
        (default all CPUs); its DynamicCache; min_new_tokens = max_new_tokens so both make
        exactly T tokens

  split ours with the rows split over --cpu_devices XLA:CPU devices (`generate(mesh=...)`;
        default one per core), for batches of more than one row; the tokens must be the same

It prints seconds and tokens/s (batch x T / s) of each, the ratios, how many new tokens agree
(greedy decoding of one function, so they should up to float near-ties), and the growth
exponent k of time ~ T^k between consecutive lengths, log(t2 / t1) / log(T2 / T1): 1 is a
per-token cost that does not grow with the length. --quick: small lengths, one repeat (a
smoke test of the whole script).
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer.inference import decode
from transformer.model import models
from transformer.training import throughput
from experiments.benchmarks.decoding import agreeing, exponent, w1

_NEW = flags.DEFINE_list("new_tokens", ["128", "256", "512", "1024"], "Lengths to generate.")
_PROMPT = flags.DEFINE_integer("prompt", 16, "Prompt length (tokens).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs of the cached path (median).")
_RECOMPUTE_MAX = flags.DEFINE_integer("recompute_max", 1024,
                                      "Skip the recompute path above this many new tokens.")
_HF_NEW = flags.DEFINE_list("hf_new_tokens", ["256", "1024", "4096"],
                            "Lengths to generate against Hugging Face generate.")
_BATCHES = flags.DEFINE_list("batches", ["1", "8"], "Batch sizes against Hugging Face.")
_HF = flags.DEFINE_bool("hf", True, "Compare with Hugging Face generate (interop extra).")
_THREADS = flags.DEFINE_integer("threads", 0, "torch intra-op threads (0: all CPUs; on a loaded "
                                "machine OpenMP's barriers wait on descheduled threads).")
_QUICK = flags.DEFINE_bool("quick", False, "Small lengths and one repeat: a smoke test.")
_ATTENTION = flags.DEFINE_enum("attention", "auto", ["auto", "dense"], "model.attention of the "
                               "converted model against HF: auto steps with the cached CPU "
                               "kernel where it applies, dense with XLA's prefix path.")
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0, "XLA:CPU devices for the split column "
                                    "(0: one per core; 1: no split column).")
_CACHE_DTYPE = flags.DEFINE_enum("cache_dtype", "float32", ["float32", "bfloat16"],
                                "model.cache_dtype of our models: bfloat16 halves what a step "
                                "reads.")
QUICK = dict(new_tokens=["8", "16"], hf_new_tokens=["8", "32"], batches=["1", "2"],
             prompt=4, repeats=1)


@functools.partial(jax.jit, static_argnames=("model", "new_tokens"))
def recompute_generate(model, params, prompt_1P, *, new_tokens):
  P = prompt_1P.shape[1]
  buf_1L = jnp.zeros((1, P + new_tokens), jnp.int32).at[:, :P].set(prompt_1P)

  def body(t, buf_1L):
    logits_1LV = model.apply({"params": params}, buf_1L)
    nxt = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_1LV, P + t - 1, 1, False), -1)
    return jax.lax.dynamic_update_slice_in_dim(buf_1L, nxt[:, None].astype(jnp.int32),
                                               P + t, 1)

  return jax.lax.fori_loop(0, new_tokens, body, buf_1L)[:, P:]


def timed(fn):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def median_seconds(fn, repeats):
  fn()  # compile / warm up
  times, out = [], None
  for _ in range(repeats):
    seconds, out = timed(fn)
    times.append(seconds)
  return float(np.median(times)), out


def growth(rows, key):
  """k in time ~ T^k between consecutive rows (T, {key: seconds})."""
  return [exponent(a[key], b[key], a["T"], b["T"]) for a, b in zip(rows, rows[1:])]


def cache_vs_recompute(lengths, P, repeats):
  cfg = w1(P + max(lengths), attention="dense", cache_dtype=_CACHE_DTYPE.value)
  model = decode.frozen(models.make_model(cfg))
  params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  prompt = np.random.default_rng(0).integers(4, 256, size=P).tolist()
  print(f"W1 decoder, fp32, {_CACHE_DTYPE.value} cache, batch 1, prompt {P}")
  print("| new tokens | cache: s | cache: tokens/s | recompute: s | recompute: tokens/s | "
        "speed-up |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: |")
  rows = []
  for T in lengths:
    t_cache, cached = median_seconds(
        lambda: decode.generate(model, params, [prompt], max_new_tokens=T, stop_tokens=()),
        repeats)
    t_full = None
    if T <= _RECOMPUTE_MAX.value:
      compiled = recompute_generate.lower(model, params, jnp.asarray([prompt], jnp.int32),
                                          new_tokens=T).compile()
      t_full, full = timed(lambda: compiled(params, jnp.asarray([prompt], jnp.int32)))
      if not np.array_equal(np.asarray(full), cached):
        print(f"  note: T={T}: recomputed tokens differ from cached ones (float ties?)")
    rows.append(dict(T=T, cache=t_cache, full=t_full))
    full_cols = (f"{t_full:.2f} | {T / t_full:.1f} | {t_full / t_cache:.0f}x" if t_full
                 else "- | - | -")
    print(f"| {T} | {t_cache:.3f} | {T / t_cache:.0f} | {full_cols} |", flush=True)
  if len(rows) < 2:
    return
  # Growth: the exponent k in time ~ T^k between the shortest and the longest length.
  ends = [rows[0], rows[-1]]
  full = all(r["full"] for r in ends)
  print(f"growth from {ends[0]['T']} to {ends[1]['T']} new tokens: cache time "
        f"x{ends[1]['cache'] / ends[0]['cache']:.1f} (~T^{growth(ends, 'cache')[0]:.2f})"
        + (f", recompute time x{ends[1]['full'] / ends[0]['full']:.1f} "
           f"(~T^{growth(ends, 'full')[0]:.2f})" if full else ""))


def hf_gpt2(P, longest, workdir):
  """A random-weight GPT2LMHeadModel of the W1 shape, and the same model converted to ours."""
  import torch  # the interop extra; imported here so the table above needs none of it
  import transformers
  from transformer.interop import hf

  transformers.utils.logging.disable_progress_bar()
  torch.manual_seed(0)
  config = transformers.GPT2Config(vocab_size=256, n_positions=P + longest, n_embd=256,
                                   n_layer=4, n_head=4, n_inner=1024, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)
  torch_model = transformers.GPT2LMHeadModel(config).eval()
  torch_model.save_pretrained(workdir)
  cfg, variables = hf.from_hf(workdir, dtype="float32", attention=_ATTENTION.value,
                              cache_dtype=_CACHE_DTYPE.value)
  return torch_model, decode.frozen(models.make_model(cfg)), variables["params"]


def against_hf(lengths, batches, P, repeats):
  import tempfile
  try:
    import torch
  except ImportError as e:
    raise ValueError("the comparison with Hugging Face generate needs the interop extra: "
                     "pip install -e '.[interop]' (or pass --nohf).") from e
  torch.set_num_threads(_THREADS.value or os.cpu_count())
  with tempfile.TemporaryDirectory() as tmp:
    torch_model, model, params = hf_gpt2(P, max(lengths), tmp)
  print(f"\nW1 shape as GPT-2 (random weights, fp32, greedy), prompt {P}, model.attention="
        f"{_ATTENTION.value}, our cache {_CACHE_DTYPE.value}; transformers generate on torch "
        f"{torch.__version__} with {torch.get_num_threads()} threads")
  devices = jax.device_count()
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",)) if devices > 1 else None
  print(f"split: the rows over {devices} XLA:CPU devices (batches > 1)" if mesh else
        "split: not run (one device)")
  print("| batch | new tokens | ours: s | ours: tokens/s | split: s | split: tokens/s | HF: s | "
        "HF: tokens/s | ours / HF | split / HF | tokens agree |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  rng = np.random.default_rng(0)
  for B in batches:
    prompts_BP = rng.integers(4, 256, size=(B, P))
    rows = []
    for T in lengths:
      ours = lambda mesh: decode.generate(model, params, prompts_BP.tolist(), max_new_tokens=T,
                                          stop_tokens=(), mesh=mesh)
      t_ours, ours_BT = median_seconds(lambda: ours(None), repeats)
      t_split = None
      if mesh is not None and B > 1:
        t_split, split_BT = median_seconds(lambda: ours(mesh), repeats)
        if not np.array_equal(split_BT, ours_BT):
          raise AssertionError(f"batch {B}, {T} tokens: the split rows decoded other tokens")

      def hf_run():
        with torch.inference_mode():
          return torch_model.generate(torch.as_tensor(prompts_BP), max_new_tokens=T,
                                      min_new_tokens=T, do_sample=False, use_cache=True,
                                      attention_mask=torch.ones(B, P, dtype=torch.long))
      t_hf, hf_BL = median_seconds(hf_run, repeats)
      hf_BT = hf_BL[:, P:].numpy()
      # Greedy tokens agree up to the first float near-tie; count the common prefix per row.
      agree = agreeing(ours_BT, hf_BT)
      rows.append(dict(T=T, ours=t_ours, hf=t_hf, split=t_split or t_ours))
      split = (f"{t_split:.3f} | {B * T / t_split:.0f}" if t_split else "- | -")
      split_ratio = f"{t_hf / t_split:.2f}x" if t_split else "-"
      print(f"| {B} | {T} | {t_ours:.3f} | {B * T / t_ours:.0f} | {split} | {t_hf:.3f} | "
            f"{B * T / t_hf:.0f} | {t_hf / t_ours:.2f}x | {split_ratio} | {agree}/{B * T} |",
            flush=True)
    for (a, b), k_ours, k_split, k_hf in zip(zip(rows, rows[1:]), growth(rows, "ours"),
                                             growth(rows, "split"), growth(rows, "hf")):
      print(f"batch {B}, {a['T']} -> {b['T']} new tokens: time ~T^{k_ours:.2f} ours"
            + (f", ~T^{k_split:.2f} split" if mesh is not None and B > 1 else "")
            + f", ~T^{k_hf:.2f} HF")


def main(argv):
  del argv
  values = {"new_tokens": _NEW.value, "hf_new_tokens": _HF_NEW.value, "batches": _BATCHES.value,
            "prompt": _PROMPT.value, "repeats": _REPEATS.value}
  if _QUICK.value:
    values.update(QUICK)
  ints = lambda name: [int(n) for n in values[name]]
  if _CPU_DEVICES.value < 0:
    raise ValueError(f"--cpu_devices={_CPU_DEVICES.value}: use 0 (one per core) or a count")
  # Before JAX's first computation: the split column's devices (the others use the first).
  jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value or os.cpu_count())
  print(f"{jax.device_count()} {jax.default_backend()} device(s), {os.cpu_count()} CPU cores, "
        f"load average {os.getloadavg()[0]:.1f}")
  # The VM's speed drifts between days: these two say how fast this machine was in this run
  # (a decode step is bound by reading the cache, so the bandwidth is the one to compare).
  print(f"fp32 jnp.dot peak (2048^3, best of 5): "
        f"{throughput.measure_matmul_peak(2048) / 1e9:.1f} GFLOP/s; memory read "
        f"(sum of 256 MiB, best of 5): {throughput.measure_read_bandwidth() / 1e9:.1f} GB/s")
  cache_vs_recompute(ints("new_tokens"), values["prompt"], values["repeats"])
  if _HF.value:
    against_hf(ints("hf_new_tokens"), ints("batches"), values["prompt"], values["repeats"])
  print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  cli.run(main)
