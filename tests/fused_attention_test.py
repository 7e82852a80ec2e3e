"""The fused CPU kernel (transformer/cpu/fused_attention.cc) against dense attention, forward and
backward, and its fallbacks. Dense is itself checked against the numpy formula in
attention_test.py; one case here also goes to numpy directly."""

import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_test
from transformer.schema import model_config
from transformer.cpu import fused_attention
from transformer.model import attention
from transformer.model.positions import AttentionTerms, alibi_slopes

pytestmark = pytest.mark.skipif(fused_attention.unavailable() is not None,
                                reason=str(fused_attention.unavailable()))

cfg = model_config()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (batch, q_len, k_len, heads, kv_heads, head size, causal, segments)
CASES = {
    "causal_one_tile": (2, 13, 13, 4, 4, 16, True, "one"),
    "causal_tiles": (2, 150, 150, 2, 2, 32, True, "one"),  # 3 tiles, the last partial
    "bidirectional": (2, 70, 70, 2, 2, 16, False, "one"),
    "packed_gqa": (2, 130, 130, 4, 2, 16, True, "packed"),
    "padded_mqa": (3, 66, 66, 4, 1, 64, True, "padded"),
    "cross": (2, 70, 45, 2, 2, 16, False, "padded"),  # queries and keys of other lengths
    "head_128": (1, 64, 64, 2, 2, 128, True, "packed"),
    # Keys in several chunks of 512 (the running max rescales the partial sums and outputs).
    "long_causal": (1, 1100, 1100, 2, 1, 16, True, "packed"),
    "long_cross": (2, 70, 1200, 2, 2, 16, False, "padded"),
}


def segments(kind, batch, length, seed):
  seg = np.ones((batch, length), np.int32)
  rng = np.random.default_rng(seed)
  for b in range(batch):
    if kind == "packed":  # documents of random lengths, padding at the end
      cuts = np.sort(rng.choice(np.arange(1, length), size=3, replace=False))
      for c in cuts:
        seg[b, c:] += 1
      seg[b, cuts[-1]:] = 0
    if kind == "padded":
      seg[b, rng.integers(1, length):] = 0
  return seg


def make_case(name, seed=0):
  B, L, S, N, K, H, causal, kind = CASES[name]
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, L, N, H)).astype(np.float32)
  k, v = (rng.normal(size=(B, S, K, H)).astype(np.float32) for _ in range(2))
  q_seg = segments(kind, B, L, seed)
  k_seg = q_seg if S == L else segments(kind, B, S, seed + 1)
  layout = attention.make_layout(L, S, batch=B, q_segments=jnp.asarray(q_seg),
                                 k_segments=jnp.asarray(k_seg), causal=causal)
  return q, k, v, layout


@functools.cache
def value_and_grads(impl):
  fn = attention.IMPLEMENTATIONS[impl]

  def loss(q, k, v, layout):
    out = fn(q, k, v, layout, AttentionTerms(), scale=q.shape[-1] ** -0.5, cfg=cfg)
    return jnp.sum(jnp.sin(out)), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_dense_forward_and_backward(name):
  q, k, v, layout = make_case(name)
  (_, out), grads = value_and_grads("fused_cpu")(q, k, v, layout)
  (_, ref_out), ref_grads = value_and_grads("dense")(q, k, v, layout)
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  for name_, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=f"d{name_}")


def test_matches_the_numpy_formula():
  """attention_test's one-query-at-a-time formula, on a packed causal case (H = 16)."""
  B, L, N, K, H = attention_test.B, attention_test.L, attention_test.N, 2, 16
  rng = np.random.default_rng(1)
  q = rng.normal(size=(B, L, N, H)).astype(np.float32)
  k, v = (rng.normal(size=(B, L, K, H)).astype(np.float32) for _ in range(2))
  seg = attention_test.segments("packed")
  layout = attention.make_layout(L, L, batch=B, q_segments=jnp.asarray(seg),
                                 k_segments=jnp.asarray(seg), causal=True)
  old_h, attention_test.H = attention_test.H, H  # the formula scales by its module's H
  try:
    expected = attention_test.numpy_reference(q, k, v, seg, None, None, True, 0, None)
  finally:
    attention_test.H = old_h
  got = fused_attention.attention(q, k, v, layout, scale=H ** -0.5)
  np.testing.assert_allclose(got, expected, atol=2e-6, rtol=1e-5)


def test_rows_that_see_nothing_are_zero_with_finite_gradients():
  q, k, v, layout = make_case("padded_mqa")
  (_, out), grads = value_and_grads("fused_cpu")(q, k, v, layout)
  pad = np.asarray(layout.q_seg_BL) == 0
  assert pad.any()
  np.testing.assert_array_equal(np.asarray(out)[pad], 0.0)
  np.testing.assert_array_equal(np.asarray(grads[0])[pad], 0.0)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_huge_masked_scores_stay_finite():
  """A masked score far above the allowed ones must not reach exp() (0 * inf = NaN)."""
  q, k, v, layout = make_case("causal_tiles")
  q, k = np.array(q), np.array(k)
  q[..., 0], k[..., 0] = 30.0, np.linspace(-30, 30, k.shape[1])[None, :, None]
  fn = lambda q, k: jnp.sum(fused_attention.attention(q, k, v, layout, scale=1.0))
  grads = jax.grad(fn, argnums=(0, 1))(q, k)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  ref = jax.grad(lambda q, k: jnp.sum(attention.dense(q, k, v, layout, AttentionTerms(),
                                                      scale=1.0, cfg=cfg)), argnums=(0, 1))(q, k)
  # Scores of ~900 carry a float32 rounding of ~6e-5, so both implementations sit ~1e-3 of
  # the largest gradient from a float64 computation (measured: dense 6.5e-4 and 6.8e-3 on
  # dq and dk, this kernel 7.8e-4 and 7.6e-3); they agree with each other to that.
  for g, r in zip(grads, ref):
    assert np.abs(np.asarray(g) - r).max() <= 2e-3 * np.abs(r).max()


def test_unknown_index_offset_and_decoding_offsets_match_dense():
  """Without a known offset every key is computed and the mask alone decides; queries that
  sit after cached keys (q_offset) see the keys up to their own index."""
  q, k, v, layout = make_case("packed_gqa")
  blind = layout.replace(index_offset=None)
  np.testing.assert_allclose(value_and_grads("fused_cpu")(q, k, v, blind)[0][1],
                             value_and_grads("dense")(q, k, v, layout)[0][1], atol=2e-6)
  step = attention.make_layout(5, 130, batch=2, causal=True, q_offset=100)
  q5 = q[:, :5]
  np.testing.assert_allclose(value_and_grads("fused_cpu")(q5, k, v, step)[0][1],
                             value_and_grads("dense")(q5, k, v, step)[0][1], atol=2e-6)


@pytest.mark.slow
def test_refuses_what_it_cannot_honour_and_auto_falls_back():
  q, k, v, layout = make_case("causal_tiles")
  alibi = AttentionTerms(bias_table=jnp.asarray(alibi_slopes(2)), bias_kind="alibi")
  refusals = [
      ((q, k, v, layout, AttentionTerms()), "bias", alibi),
      ((q, k, v, layout.replace(window=4), AttentionTerms()), "sliding window", None),
      ((q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), layout,
        AttentionTerms()), "float32", None),
      ((q[..., :8], k[..., :8], v[..., :8], layout, AttentionTerms()), "divisible by 16", None),
  ]
  for (q_, k_, v_, lay, terms), message, bias_terms in refusals:
    terms = bias_terms or terms
    with pytest.raises(ValueError, match=message):
      attention.fused_cpu(q_, k_, v_, lay, terms, scale=1.0, cfg=cfg)
    got = attention.auto(q_, k_, v_, lay, terms, scale=1.0, cfg=cfg)
    expected = attention.query_blocks(q_, k_, v_, lay, terms, scale=1.0, cfg=cfg)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32),
                               atol=1e-6)


def test_auto_uses_the_kernel_where_it_applies():
  """From one full tile of queries up; a shorter query block (a decoding step) would waste
  most of the tile, so auto leaves it to query_blocks."""
  for name, expected in (("causal_tiles", True), ("causal_one_tile", False)):
    q, k, v, layout = make_case(name)
    fn = lambda q: attention.auto(q, k, v, layout, AttentionTerms(), scale=1.0, cfg=cfg)
    assert ("transformer_attention_fwd" in jax.jit(fn).lower(q).as_text()) == expected, name


def _run(script: str, **env) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT}/tests", **env})


def test_sharded_over_batch_and_heads_matches_one_device():
  """Under jit with NamedSharding the kernel runs on each device's shard (no gathers of
  q, k or v) and gives one device's values bitwise."""
  script = """
    import json, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from fused_attention_test import make_case, value_and_grads
    q, k, v, layout = make_case("packed_gqa")
    (loss, out), grads = value_and_grads("fused_cpu")(q, k, v, layout)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"))
    heads = NamedSharding(mesh, P("data", None, "tensor", None))
    rows = NamedSharding(mesh, P("data"))
    put = lambda x, s: jax.device_put(x, s)
    lay = jax.tree.map(lambda x: put(x, rows), layout)
    args = (put(q, heads), put(k, heads), put(v, heads), lay)
    fn = value_and_grads("fused_cpu")
    (s_loss, s_out), s_grads = fn(*args)
    hlo = fn.lower(*args).compile().as_text()
    same = all(np.array_equal(a, b) for a, b in zip([out, *grads], [s_out, *s_grads]))
    print(json.dumps({"same": same, "gathers": hlo.count("all-gather"),
                      "out_sharding": str(s_out.sharding.spec)}))
  """
  result = _run(script, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["same"], report
  assert report["gathers"] == 0, report
  assert "data" in report["out_sharding"] and "tensor" in report["out_sharding"], report


def test_threads_are_the_cores_of_the_devices_the_call_spans():
  """In a process with per-core devices, an unsharded call runs on one device while the others
  idle, so it takes every core; split over two devices, each takes half."""
  script = """
    import json, re, jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from fused_attention_test import make_case, value_and_grads
    from transformer.cpu import fused_attention
    q, k, v, layout = make_case("packed_gqa")
    fn = value_and_grads("fused_cpu")
    threads = lambda *a: sorted(set(re.findall(r"threads = (\\d+)", fn.lower(*a).compile().as_text())))
    rows = NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))
    split = jax.tree.map(lambda x: jax.device_put(x, rows), (q, k, v, layout))
    print(json.dumps({"cores": fused_attention.cores(), "whole": threads(q, k, v, layout),
                      "split": threads(*split)}))
  """
  result = _run(script, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["whole"] == [str(report["cores"])], report
  assert report["split"] == [str(max(1, report["cores"] // 2))], report


def test_the_avx2_build_matches_dense(tmp_path):
  """The AVX2 code (two 8-float halves per 16-float vector, 16-bit lane masks, scalar
  packing) is what CPUs without AVX-512 run: built and checked here on any CPU."""
  script = """
    import numpy as np
    from fused_attention_test import make_case, value_and_grads
    for name in ("causal_tiles", "packed_gqa", "padded_mqa", "long_causal"):
      q, k, v, layout = make_case(name)
      (_, out), grads = value_and_grads("fused_cpu")(q, k, v, layout)
      (_, ref), refs = value_and_grads("dense")(q, k, v, layout)
      print(name, max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                      for a, b in zip([out, *grads], [ref, *refs])))
  """
  result = _run(script, TRANSFORMER_KERNEL_ISA="avx2",
                TRANSFORMER_KERNEL_CACHE=str(tmp_path / "cache"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert [p.name.startswith("cpu_attention-") for p in (tmp_path / "cache").iterdir()] == [True]
  errors = dict(line.split() for line in result.stdout.strip().splitlines()[-4:])
  assert len(errors) == 4 and all(float(e) < 2e-5 for e in errors.values()), errors


@pytest.mark.slow
def test_a_failed_build_is_one_line_and_auto_falls_back(tmp_path):
  script = """
    import jax.numpy as jnp, numpy as np
    from transformer.cpu import fused_attention
    from transformer.model import attention
    from fused_attention_test import make_case, cfg
    from transformer.model.positions import AttentionTerms
    print(fused_attention.unavailable())
    q, k, v, layout = make_case("causal_tiles")
    got = attention.auto(q, k, v, layout, AttentionTerms(), scale=1.0, cfg=cfg)
    ref = attention.dense(q, k, v, layout, AttentionTerms(), scale=1.0, cfg=cfg)
    print(float(jnp.max(jnp.abs(got - ref))))
    try:
      attention.fused_cpu(q, k, v, layout, AttentionTerms(), scale=1.0, cfg=cfg)
    except ValueError as e:
      print(e)
  """
  result = _run(script, CXX=str(tmp_path / "no-such-compiler"),
                TRANSFORMER_KERNEL_CACHE=str(tmp_path / "cache"))
  assert result.returncode == 0, result.stderr[-3000:]
  reason, diff, error = result.stdout.strip().splitlines()[-3:]
  assert reason.startswith("the fused CPU kernel could not be built"), reason
  assert float(diff) < 1e-5
  assert error.startswith("model.attention='fused_cpu': the fused CPU kernel could not be "
                          "built") and "use 'auto' or 'query_blocks'" in error, error


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder_decoder"])
def test_whole_models_match_dense_under_scan_and_remat(kind):
  """Self- and cross-attention through the kernel inside the real model (scanned layers,
  rematerialization), against the same parameters with dense attention."""
  from transformer.model import models
  from transformer.schema import position_config

  def make(attention_impl, scan=False, remat="none"):
    return models.make_model(model_config(
        kind=kind, vocab_size=37, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
        d_ff=96, max_len=80, position=position_config("rope"), attention=attention_impl,
        scan_layers=scan, remat=remat))

  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(4, 37, size=(2, 70)), jnp.int32)
  segs = np.ones((2, 70), np.int32)
  segs[1, 50:] = 0  # padding
  args = (ids, ids) if kind == "encoder_decoder" else (ids,)
  segs = jnp.asarray(segs)
  kwargs = ({"encoder_segment_ids": segs, "decoder_segment_ids": segs}
            if kind == "encoder_decoder" else {"segment_ids": segs})
  for scan, remat in [(False, "none"), (True, "full"), (True, "dots")]:
    dense, fused = make("dense", scan, remat), make("fused_cpu", scan, remat)
    params = dense.init(jax.random.key(0), *args)["params"]
    loss = lambda m, p: jnp.mean(jnp.sin(m.apply({"params": p}, *args, **kwargs)))
    for a, b in zip(jax.tree.leaves(jax.value_and_grad(functools.partial(loss, fused))(params)),
                    jax.tree.leaves(jax.value_and_grad(functools.partial(loss, dense))(params))):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    lowered = jax.jit(functools.partial(loss, fused)).lower(params).as_text()
    assert "transformer_attention_fwd" in lowered


def test_repeated_calls_are_bitwise_identical():
  """Work items are split over threads in any order, but each is computed the same way."""
  q, k, v, layout = make_case("packed_gqa")
  first = value_and_grads("fused_cpu")(q, k, v, layout)
  for _ in range(3):
    again = value_and_grads("fused_cpu")(q, k, v, layout)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
      np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_training_with_the_kernel_resumes_bitwise_and_matches_meshes(tmp_path):
  """The train command with attention through the kernel (rows of 64 tokens): a run stopped
  by SIGTERM and resumed ends bitwise equal to an uninterrupted one, and a (2, 2, 2) mesh of
  8 fake devices (batch, fsdp and heads sharded) gives one device's losses."""
  from transformer.training import checkpoint
  data_dir = str(tmp_path / "tfds")
  sets = ["data.seq_len=64", "model.attention=fused_cpu", "train.steps=4",
          "train.checkpoint_every=2"]

  def run(workdir, *flags, devices=None):
    cmd = [sys.executable, os.path.join(ROOT, "tests", "helpers", "tiny_run.py"), "--workdir",
           str(tmp_path / workdir), "--data_dir", data_dir, *flags]
    for s in sets:
      cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT}/tests"}
    if devices:
      env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

  reference = run("one")
  assert run("stopped", "--signal_at_step", "2:SIGTERM")["summary"]["stopped"]
  resumed = run("stopped")
  assert resumed["losses"] == reference["losses"]
  params = [jax.tree.leaves(jax.device_get(checkpoint.load_for_inference(
      str(tmp_path / name))[2])) for name in ("one", "stopped")]
  for a, b in zip(*params):
    np.testing.assert_array_equal(a, b)

  meshed = run("mesh", "--set", "mesh.shape=[2,2,2]", devices=8)
  assert meshed["devices"] == 8
  steps = sorted(reference["losses"])
  np.testing.assert_allclose([meshed["losses"][s] for s in steps],
                             [reference["losses"][s] for s in steps], atol=1e-5, rtol=0)
