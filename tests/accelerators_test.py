"""Accelerator attention paths checked on CPU against `dense`:

  structured_attention  the exact jax.nn.dot_product_attention call `cudnn` makes, with
                        implementation="xla" (same arguments: is_causal, sequence lengths,
                        local_window_size, bias)
  splash, pallas_gpu    JAX's Pallas kernels in interpret mode (tiny shapes)
  AUTO_TABLE            auto's choice per backend, dtype and feature
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import attention
from transformer.schema import model_config
from tests.helpers.attention_cases import bias_terms, positions_of

B, N, H = 2, 4, 32
cfg = model_config()


def segments(kind, L):
  seg = np.ones((B, L), np.int32)
  if kind == "right_padded":
    seg[0, L * 3 // 4:] = 0
    seg[1, L // 3:] = 0
  if kind == "packed":
    seg[0, L // 3:] = 2
    seg[0, L * 7 // 8:] = 0
    seg[1, L // 5:] = 2
    seg[1, L // 2:] = 3
  return seg


def case(*, L=16, causal=True, window=0, K=N, segs="single", prefix=False, bias="",
         dtype=np.float32, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, L, N, H)).astype(dtype)
  k = rng.normal(size=(B, L, K, H)).astype(dtype)
  v = rng.normal(size=(B, L, K, H)).astype(dtype)
  seg = segments(segs, L)
  pos = positions_of(seg)
  pre = None
  if prefix:
    pre = np.zeros((B, L), bool)
    pre[:, :L // 4] = True
  arrays = {} if segs == "single" else dict(
      q_segments=jnp.asarray(seg), k_segments=jnp.asarray(seg), q_positions=jnp.asarray(pos),
      k_positions=jnp.asarray(pos))
  layout = attention.make_layout(L, L, batch=B, causal=causal, window=window, segments=segs,
                                 prefix=None if pre is None else jnp.asarray(pre), **arrays)
  terms = bias_terms(bias, causal=causal, num_heads=N, rng=rng)
  return q, k, v, layout, terms


def xla_structured(q, k, v, layout, terms, *, scale, cfg):
  return attention.structured_attention(q, k, v, layout, terms, scale=scale,
                                        implementation="xla")


def xla_masked(q, k, v, layout, terms, *, scale, cfg):
  return attention.masked_attention(q, k, v, layout, terms, scale=scale, implementation="xla")


FNS = {"structured": xla_structured, "masked": xla_masked,
       "splash": attention.IMPLEMENTATIONS["splash"],
       "pallas_gpu": attention.IMPLEMENTATIONS["pallas_gpu"],
       "dense": attention.IMPLEMENTATIONS["dense"]}


@functools.lru_cache(maxsize=None)
def forward(name):
  fn = FNS[name]
  return jax.jit(lambda q, k, v, lay, terms: fn(q, k, v, lay, terms, scale=H ** -0.5, cfg=cfg))


@functools.lru_cache(maxsize=None)
def gradient(name):
  fn = FNS[name]

  def loss(q, k, v, lay, terms):
    return jnp.sum(jnp.sin(fn(q, k, v, lay, terms, scale=H ** -0.5, cfg=cfg)))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def check(name, args, *, grads=True, atol=1e-5):
  np.testing.assert_allclose(forward(name)(*args), forward("dense")(*args), atol=atol)
  if grads:
    for got, want in zip(gradient(name)(*args), gradient("dense")(*args)):
      np.testing.assert_allclose(got, want, atol=atol * 10)


# ---------------------------------------------------------------------------------------------
# structured_attention: every layout it accepts, forward and gradients.

STRUCTURED = {
    "bidirectional": dict(causal=False),
    "causal": dict(),
    "right_padded": dict(segs="right_padded"),
    "right_padded_bidirectional": dict(causal=False, segs="right_padded"),
    "window": dict(window=5),
    "window_bidirectional": dict(causal=False, window=4),  # xla only: cuDNN refuses it
    "window_padded": dict(window=3, segs="right_padded"),
    "gqa": dict(K=2, segs="right_padded"),
    "mqa": dict(K=1, causal=False),
    "alibi": dict(bias="alibi"),
    "t5_padded": dict(causal=False, K=2, segs="right_padded", bias="t5"),
    "t5_window": dict(window=6, bias="t5"),
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_structured_call_matches_dense(name):
  check("structured", case(**STRUCTURED[name]))


@pytest.mark.parametrize("kw, why", [
    (dict(segs="packed"), "segment ids"),
    (dict(prefix=True), "prefix"),
])
def test_structured_call_refuses_what_the_api_cannot_say(kw, why):
  q, k, v, layout, terms = case(**kw)
  assert why in attention.structure_refusal(q, k, layout, terms)
  with pytest.raises(ValueError, match=why):
    xla_structured(q, k, v, layout, terms, scale=1.0, cfg=cfg)


def test_cudnn_refuses_a_bidirectional_window_and_needs_a_gpu():
  q, k, v, layout, terms = case(causal=False, window=4)
  assert "causal only" in attention.structure_refusal(q, k, layout, terms)
  assert attention.structure_refusal(q, k, layout, terms, implementation="xla") is None
  with pytest.raises(ValueError, match="needs a GPU"):
    attention.cudnn(q, k, v, layout, terms, scale=1.0, cfg=cfg)


@pytest.mark.parametrize("kw", [dict(segs="packed"), dict(prefix=True, K=2),
                                dict(segs="packed", bias="alibi")])
def test_masked_fallback_matches_dense(kw):
  check("masked", case(**kw))


# ---------------------------------------------------------------------------------------------
# Pallas kernels in interpret mode.

PALLAS = {
    # name: (case, implementations that accept it)
    "causal": (dict(), ("splash", "pallas_gpu")),
    "bidirectional": (dict(causal=False), ("splash", "pallas_gpu")),
    "right_padded": (dict(segs="right_padded"), ("splash", "pallas_gpu")),
    "packed": (dict(segs="packed"), ("splash", "pallas_gpu")),
    "packed_gqa": (dict(segs="packed", K=2), ("splash", "pallas_gpu")),
    "mqa_padded_bidirectional": (dict(K=1, causal=False, segs="right_padded"), ("splash",)),
    "window": (dict(window=40), ("splash",)),
    "window_packed_bidirectional": (dict(window=33, causal=False, segs="packed"), ("splash",)),
}
PALLAS_L = 128


@pytest.mark.parametrize("name", sorted(PALLAS))
@pytest.mark.parametrize("impl", ["splash", "pallas_gpu"])
def test_pallas_kernels_match_dense_in_interpret_mode(impl, name):
  kw, accepted = PALLAS[name]
  args = case(L=PALLAS_L, **kw)
  refusal = attention.REFUSALS[impl](args[0], args[1], args[3], args[4])
  if impl not in accepted:
    assert refusal is not None
    with pytest.raises(ValueError, match=impl):
      FNS[impl](*args, scale=1.0, cfg=cfg)
    return
  assert refusal is None
  check(impl, args, grads=name in ("packed", "packed_gqa", "window", "right_padded"),
        atol=2e-5)


@pytest.mark.parametrize("impl", ["splash", "pallas_gpu"])
@pytest.mark.parametrize("kw, why", [
    (dict(bias="alibi"), "score bias"),
    (dict(prefix=True), "prefix"),
    (dict(L=100), "multiple of"),
    (dict(dtype=np.float16), "dtype"),
])
def test_pallas_kernels_refuse_clearly(impl, kw, why):
  if impl == "pallas_gpu" and why == "dtype":
    kw = dict(L=64)  # float16 is fine for Triton; check the head size instead
    q, k, v, layout, terms = case(**kw)
    q = q[..., :24]
    k = k[..., :24]
    why = "power of two"
  else:
    q, k, v, layout, terms = case(**kw)
  assert why in attention.REFUSALS[impl](q, k, layout, terms)


# ---------------------------------------------------------------------------------------------
# auto's table.

@pytest.mark.parametrize("backend, kw, dtype, expected", [
    ("tpu", dict(L=128, segs="packed", K=2), np.float32, "splash"),
    ("tpu", dict(L=128, bias="alibi"), jnp.bfloat16, "dense"),
    ("tpu", dict(L=100), jnp.bfloat16, "dense"),
    ("gpu", dict(segs="right_padded", bias="alibi"), jnp.bfloat16, "cudnn"),
    ("gpu", dict(L=128, segs="packed"), jnp.bfloat16, "pallas_gpu"),
    ("gpu", dict(L=128, segs="packed", bias="alibi"), jnp.bfloat16, "cudnn"),
    ("gpu", dict(prefix=True), jnp.float16, "cudnn"),
    ("gpu", dict(), np.float32, "dense"),
    ("cpu", dict(L=13), np.float32, "query_blocks"),
])
def test_auto_table(backend, kw, dtype, expected):
  q, k, v, layout, terms = case(dtype=np.float32, **kw)
  q, k = q.astype(dtype), k.astype(dtype)
  assert attention.choose(backend, jnp.asarray(q), jnp.asarray(k), layout, terms) == expected


def test_auto_table_rows_name_registered_implementations():
  for backend, dtypes, name, condition in attention.AUTO_TABLE:
    assert name in attention.IMPLEMENTATIONS
    assert condition is None or condition in attention.AUTO_CONDITIONS


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["splash", "pallas_gpu"])
def test_a_decoder_on_packed_rows_gives_dense_logits(impl):
  """Through the model: the Tower's packed layout, RoPE applied before the kernel."""
  from transformer.model import models
  L = PALLAS_L
  base = model_config(kind="decoder", vocab_size=64, d_model=64, num_layers=2, num_heads=2,
                      num_kv_heads=1, d_ff=128, max_len=L)
  seg = segments("packed", L)
  tokens = np.random.default_rng(0).integers(0, 64, (B, L)).astype(np.int32)
  params = models.make_model(base).init(jax.random.key(0), tokens)["params"]
  logits = {}
  for name in ("dense", impl):
    model = models.make_model(model_config(**{**base.to_dict(), "attention": name}))
    logits[name] = jax.jit(lambda p, t, s, q: model.apply({"params": p}, t, segment_ids=s,
                                                          positions=q))(
        params, tokens, seg, positions_of(seg))
  np.testing.assert_allclose(logits[impl], logits["dense"], atol=1e-4)


def test_the_readme_shows_auto_table_in_its_order():
  """The README's auto table lists AUTO_TABLE's rows, in order (its last row joins two)."""
  import itertools
  import pathlib
  readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
  table = readme[readme.index("| backend | compute dtype | implementation | for |"):]
  lines = itertools.takewhile(lambda line: line.startswith("|"), table.splitlines()[2:])
  rows = [line.split("|")[3].strip() for line in lines]
  shown = [name.strip() for row in rows for name in row.split(",")]
  assert shown == [name for _, _, name, _ in attention.AUTO_TABLE]


# ---------------------------------------------------------------------------------------------
# Under a mesh: the Pallas kernels run per device (shard_map), since XLA cannot partition a
# Pallas custom call; interpret mode partitions anyway, so the test reads the program too.

SHARDED_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
import jax, numpy as np
import accelerators_test as t
from transformer.training import sharding
assert jax.device_count() == 8, jax.devices()
mesh = jax.make_mesh((2, 1, 4), sharding.MESH_AXES,
                     axis_types=(jax.sharding.AxisType.Auto,) * 3)
out = {{}}
for impl in ("splash", "pallas_gpu"):
  for name, kw in (("packed", dict(segs="packed")), ("gqa", dict(segs="packed", K=2)),
                   ("mqa", dict(segs="right_padded", K=1))):
    args = t.case(L=t.PALLAS_L, **kw)
    want = t.forward("dense")(*args)
    with sharding.activate(mesh):
      fn = lambda q, k, v, lay, terms: t.FNS[impl](q, k, v, lay, terms, scale=t.H ** -0.5,
                                                  cfg=t.cfg)
      jaxpr = str(jax.make_jaxpr(fn)(*args))
      got = jax.jit(fn)(*args)
      grads = jax.jit(jax.grad(lambda *a: jax.numpy.sum(jax.numpy.sin(fn(*a))),
                               argnums=(0, 1, 2)))(*args)
    want_grads = t.gradient("dense")(*args)
    out[impl + "/" + name] = dict(
        error=float(np.max(np.abs(np.asarray(got) - np.asarray(want)))),
        grad_error=max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
                       for g, w in zip(grads, want_grads)),
        shard_map="shard_map" in jaxpr,
        specs=[line.strip() for line in jaxpr.splitlines() if "in_specs" in line][:1])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_pallas_kernels_run_per_device_under_a_mesh():
  import os
  import subprocess
  import sys
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, PYTHONPATH=os.path.dirname(here))
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  proc = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT.format(here=here)],
                        capture_output=True, text=True, env=env, timeout=900,
                        cwd=os.path.dirname(here))
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(got) == 6
  for key, row in got.items():
    assert row["error"] < 2e-5 and row["grad_error"] < 2e-4, (key, row)
    assert row["shard_map"], key
    specs = row["specs"][0]
    # Rows split over data (and fsdp); heads over tensor only where the key/value heads
    # split with them (4 of 4) or there is one (MQA); 2 kv heads on tensor=4 stay whole.
    assert "'data', 'fsdp'" in specs, (key, specs)
    assert ("tensor" in specs) == (not key.endswith("/gqa")), (key, specs)
