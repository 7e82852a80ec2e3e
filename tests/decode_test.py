"""KV-cache decoding equals the full forward pass; sampling, stop tokens, beam search, errors.

Every check of cached decoding compares against the model's own full forward pass on the same
left-padded batch (segment 0 on the pads, positions restarting at each row's first token),
which models_test already ties to the unpadded sequences.
"""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.analysis import model_stats
from transformer.inference import beam_search, decode
from transformer.model import models
from tests.helpers.tiny_models import built, tiny

pytestmark = pytest.mark.slow  # whole models compiled per case (conftest.py)

SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi", "t5_bias"]
PROMPTS = [[1, 5, 6], [1, 7, 8, 9, 10]]  # different lengths: the batch is left-padded
ENCODER_INPUTS = [[5, 6, 7, 2], [8, 9, 2]]
DECODER_PROMPTS = [[1], [1, 4]]


def full_forward_fn(model, params, kind, start_B):
  """A compiled full forward pass over a left-padded [B, length] batch of decoder tokens."""
  enc_tokens, enc_seg = decode.right_pad(ENCODER_INPUTS)

  @jax.jit
  def forward(tokens_BL):
    seg, pos = decode.padded_inputs(start_B, tokens_BL.shape[1])
    if kind == "decoder":
      return model.apply({"params": params}, tokens_BL, segment_ids=seg, positions=pos)
    return model.apply({"params": params}, enc_tokens, tokens_BL, encoder_segment_ids=enc_seg,
                       decoder_segment_ids=seg, decoder_positions=pos)
  return forward


def check_against_full_forward(kind, model, params, prompts, T):
  """Cached logits == full-forward logits at every real position, and greedy generation ==
  repeated argmax of full forward passes (one pass per new token)."""
  encoder_inputs = ENCODER_INPUTS if kind == "encoder_decoder" else None
  new_BT, cached_BXV = decode.generate(model, params, prompts, max_new_tokens=T,
                                       stop_tokens=(), encoder_inputs=encoder_inputs,
                                       return_logits=True)
  prompt_BP, start_B = decode.left_pad(prompts)
  P = prompt_BP.shape[1]
  forward = full_forward_fn(model, params, kind, start_B)
  # Repeated argmax: the future is padding, which causality keeps out of sight.
  tokens_BL = np.concatenate([prompt_BP, np.zeros((len(prompts), T), np.int32)], axis=1)
  for t in range(T):
    tokens_BL[:, P + t] = np.argmax(forward(tokens_BL)[:, P + t - 1], axis=-1)
  np.testing.assert_array_equal(new_BT, tokens_BL[:, P:])
  full_BXV = np.asarray(forward(tokens_BL))[:, :-1]
  real_BX = np.arange(P + T - 1)[None] >= start_B[:, None]
  np.testing.assert_allclose(cached_BXV[real_BX], full_BXV[real_BX], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cached_decoding_equals_full_forward(kind, scheme):
  _, model, params = built(kind, scheme)
  prompts = PROMPTS if kind == "decoder" else DECODER_PROMPTS
  check_against_full_forward(kind, model, params, prompts, T=4)


@pytest.mark.parametrize("scheme,scan", [("rope", False), ("alibi", True)])
def test_sliding_window_ring_cache_equals_full_forward(scheme, scan):
  # The 5-token prompt overflows the 3-slot ring at prefill and the steps keep wrapping; MQA.
  _, model, params = built("decoder", scheme, window=3, num_kv_heads=1, scan_layers=scan)
  check_against_full_forward("decoder", model, params, PROMPTS, T=5)


def test_padded_batch_row_equals_prompt_alone():
  _, model, params = built("decoder", "learned")
  batch = decode.generate(model, params, PROMPTS, max_new_tokens=6, stop_tokens=())
  alone = decode.generate(model, params, PROMPTS[:1], max_new_tokens=6, stop_tokens=())
  np.testing.assert_array_equal(batch[:1], alone)


@pytest.mark.parametrize("kind,overrides", [
    ("decoder", {}), ("decoder", dict(window=4)), ("decoder", dict(num_kv_heads=1)),
    ("encoder_decoder", {})])
def test_cache_bytes_equal_inspect(kind, overrides):
  cfg, model, params = built(kind, "rope", **overrides)
  B, length = 3, 10
  enc = {}
  if kind == "encoder_decoder":
    tokens, seg = decode.right_pad([[5] * 6] * B)
    enc = dict(encoded_BSD=decode.encode(model, params, tokens, seg), encoder_segment_ids_BS=seg)
  cache = decode.init_cache(model, params, B, length, **enc)
  expected = B * model_stats.kv_cache_bytes(cfg, length, 4, encoder_length=6 if enc else 0)
  assert decode.cache_nbytes(cache) == expected
  # Only num_kv_heads heads are kept: GQA halves this config's cache against MHA.
  K_axis = {x.shape[-3] for x in jax.tree.leaves(cache)}  # [..., B, K, S, H]
  assert K_axis == {cfg.num_kv_heads}


def test_cross_attention_keys_and_values_come_from_the_cache_after_prefill():
  cfg, model, params = built("encoder_decoder", "t5_bias")
  tokens, seg = decode.right_pad(ENCODER_INPUTS)
  encoded = decode.encode(model, params, tokens, seg)
  prompt, start = decode.left_pad(DECODER_PROMPTS)
  _, state = decode.prefill(model, params, prompt, start, 4, encoded, seg)
  logits, _ = decode.step(model, params, state, jnp.asarray([5, 6]))
  # Steps never project the encoder output again: poisoned cross K/V weights change nothing.
  poison = lambda path, x: jnp.full_like(x, jnp.nan) if (
      "cross_attention" in jax.tree_util.keystr(path)
      and ("'key'" in jax.tree_util.keystr(path) or "'value'" in jax.tree_util.keystr(path))
  ) else x
  poisoned = jax.tree_util.tree_map_with_path(poison, params)
  logits2, _ = decode.step(model, poisoned, state, jnp.asarray([5, 6]))
  np.testing.assert_array_equal(logits, logits2)


def test_loop_compiles_once_sampling_is_seeded_and_top_filters_reduce_to_greedy(monkeypatch):
  _, model, params = built("decoder", "rope")
  calls = []
  original = decode.step
  monkeypatch.setattr(decode, "step", lambda *a: calls.append(1) or original(*a))
  # A length no other test uses, so this test does the compiling.
  gen = functools.partial(decode.generate, model, params, PROMPTS, max_new_tokens=9,
                          stop_tokens=())
  greedy = gen()
  hot = decode.Sampling(temperature=1.5)
  a, b, c = gen(sampling=hot, seed=0), gen(sampling=hot, seed=0), gen(sampling=hot, seed=1)
  np.testing.assert_array_equal(a, b)
  assert (a != c).any() and (a != greedy).any()
  np.testing.assert_array_equal(gen(sampling=decode.Sampling(1.5, top_k=1), seed=3), greedy)
  np.testing.assert_array_equal(gen(sampling=decode.Sampling(1.5, top_p=1e-6), seed=3), greedy)
  # Nine tokens, eight steps, five settings: the step was traced once (a while_loop body).
  assert len(calls) == 1


def test_bucket_lengths_cover_every_length_with_few_shapes():
  for n in range(1, 700):
    b = decode.bucket_length(n)
    assert n <= b and (b <= 64 and b & (b - 1) == 0 or b % 64 == 0 and b - n < 64)
  assert len({decode.bucket_length(n) for n in range(1, 1025)}) == 4 + 15  # 8..64, 128..1024


def test_prompts_of_one_bucket_share_a_compiled_loop_and_match_their_own_padding():
  _, model, params = built("decoder", "alibi")
  gen = functools.partial(decode.generate, model, params, max_new_tokens=5, stop_tokens=())
  before = decode._generate._cache_size()  # pylint: disable=protected-access
  prompts = [[1, 3, 4], [1, 3, 4, 5, 6], [1, 3, 4, 5, 6, 7, 8]]  # 3, 5 and 7 tokens: bucket 8
  outs = [gen([p]) for p in prompts]
  for stops in [(2,), (2, 5), (2, 5, 7)]:  # nor does the number of stop tokens compile anew
    gen([prompts[0]], stop_tokens=stops)
  assert decode._generate._cache_size() - before == 1  # pylint: disable=protected-access
  # The bucket's pads are masked: the batch of all three gives each row's tokens alone.
  np.testing.assert_array_equal(gen(prompts), np.concatenate(outs))


def test_the_bucket_stops_at_a_learned_position_table():
  cfg, model, params = built("decoder", "learned")  # max_len 32
  prompt = [1] + list(range(3, 19))  # 17 tokens: bucket 32, but 17 + 15 fill the table
  assert decode.padded_length(cfg, [prompt], 15) == 17
  assert decode.padded_length(cfg, [prompt], 4) == 28
  assert decode.generate(model, params, [prompt], max_new_tokens=15).shape == (1, 15)


def test_stop_tokens_end_rows_and_pad_after():
  _, model, params = built("decoder", "rope")
  greedy = decode.generate(model, params, PROMPTS, max_new_tokens=7, stop_tokens=())
  stop = int(greedy[0, 2])
  out = decode.generate(model, params, PROMPTS, max_new_tokens=7, stop_tokens=(stop,))
  for row, ref in zip(out, greedy):
    end = list(ref).index(stop) + 1 if stop in ref else len(ref)
    np.testing.assert_array_equal(row[:end], ref[:end])
    assert (row[end:] == decode.PAD_ID).all()


@functools.lru_cache(maxsize=None)
def _sampler():
  draw = lambda logits, key, t, k, p: decode.sample(logits[None], key, t, k, p)[0]
  return jax.jit(jax.vmap(draw, in_axes=(None, 0, None, None, None)))


def _draws(probs, temperature=1.0, top_k=0, top_p=1.0, n=4000):
  keys = jax.random.split(jax.random.key(0), n)
  out = _sampler()(jnp.log(jnp.asarray(probs, jnp.float32)), keys, jnp.float32(temperature),
                   jnp.int32(top_k), jnp.float32(top_p))
  return np.bincount(np.asarray(out), minlength=len(probs)) / n


def test_no_stop_tokens_means_every_step_runs_even_after_pad_ids():
  """With stop_tokens=() nothing ends a row early, not even the PAD_ID (0) that the stop
  list's padding must not stand for: every position gets the logits of a step."""
  _, model, params = built("decoder", "rope", head_bias=True)
  params = nn.unbox(params)
  params = {**params, "head": {**params["head"], "bias": params["head"]["bias"].at[decode.PAD_ID].set(50.0)}}
  out, logits = decode.generate(model, params, [[1, 5, 6]], max_new_tokens=4, stop_tokens=(),
                                return_logits=True)
  assert (out == decode.PAD_ID).all()  # the model emits PAD_ID every step ...
  assert (np.abs(np.asarray(logits[0])).max(-1) > 0).all()  # ... and every step ran


def test_sample_filters_and_temperature():
  probs = [0.05, 0.5, 0.15, 0.3]
  np.testing.assert_allclose(_draws(probs), probs, atol=0.03)
  assert set(np.nonzero(_draws(probs, top_k=2))[0]) == {1, 3}
  # Nucleus: 0.5 + 0.3 reaches 0.7; at p = 0.5 the top token alone reaches it.
  assert set(np.nonzero(_draws(probs, top_p=0.7))[0]) == {1, 3}
  assert set(np.nonzero(_draws(probs, top_p=0.5))[0]) == {1}
  # Both: top-2 renormalized is 0.625 and 0.375, so at p = 0.6 the top token alone reaches it.
  assert set(np.nonzero(_draws(probs, top_k=2, top_p=0.6))[0]) == {1}
  hot = np.asarray(probs) ** 0.5 / np.sum(np.asarray(probs) ** 0.5)  # temperature 2
  np.testing.assert_allclose(_draws(probs, temperature=2.0), hot, atol=0.03)
  assert set(np.nonzero(_draws(probs, temperature=0.0))[0]) == {1}


def test_beam_search_finds_the_exhaustive_best_with_length_penalty():
  """Vocabulary 6, 3 new tokens, 36 beams keep every prefix, so beam search must return the
  exact ranking of all hypotheses, by log p / ((5 + length) / 6) ** alpha: those that end in
  EOS, and those that max_new_tokens cuts (scored at that length)."""
  V, T, alpha = 6, 3, 0.6
  cfg = tiny("encoder_decoder", "t5_bias", vocab_size=V, num_layers=1)
  model = models.make_model(cfg)
  params = model.init(jax.random.key(1), *models.dummy_inputs(cfg, 1, 8))["params"]
  encoder_inputs = [[3, 4, 5, 2], [5, 3, 2]]
  tokens_BWT, scores_BW = beam_search.beam_search(model, params, None, max_new_tokens=T,
                                             beam_size=V * V, length_penalty_alpha=alpha,
                                             encoder_inputs=encoder_inputs)
  seqs_NT = np.asarray(list(itertools.product(range(V), repeat=T)), np.int32)
  n = len(seqs_NT)
  enc, seg = decode.right_pad(encoder_inputs)
  inputs_NT = np.concatenate([np.full((n, 1), decode.BOS_ID), seqs_NT[:, :-1]], 1)
  for b in range(len(encoder_inputs)):
    logits = model.apply({"params": params}, np.repeat(enc[b:b + 1], n, 0), inputs_NT,
                         encoder_segment_ids=np.repeat(seg[b:b + 1], n, 0))
    logp_NT = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), seqs_NT[..., None],
                                 -1)[..., 0]
    best = {}
    for s, lp in zip(seqs_NT, logp_NT):
      end = list(s).index(decode.EOS_ID) + 1 if decode.EOS_ID in s else T
      best[tuple(s[:end])] = lp[:end].sum() / ((5 + end) / 6) ** alpha
    ranked = sorted(best.items(), key=lambda kv: -kv[1])[:V * V]  # all the beams return
    assert any(decode.EOS_ID not in seq for seq, _ in ranked)  # both kinds are ranked here
    for w, (seq, score) in enumerate(ranked):
      assert tuple(tokens_BWT[b, w, :len(seq)]) == seq
      assert (tokens_BWT[b, w, len(seq):] == decode.PAD_ID).all()
      np.testing.assert_allclose(scores_BW[b, w], score, atol=1e-5)


def _beam_search_reference(logp_of, V, W, T, alpha, eos):
  """Beam search as its docstring states it, in plain Python and with no early stop: each
  step extends the W alive hypotheses by every token, keeps the best 2W; those ending in eos
  are finished (scored log p / ((5 + n) / 6) ** alpha), the best W others stay alive; at T
  the alive ones are scored at length T and everything is ranked."""
  penalty = lambda n: ((5 + n) / 6) ** alpha
  alive, finished = [((), 0.0)], []
  for _ in range(T):
    candidates = sorted(((seq + (v,), lp + logp_of(seq)[v]) for seq, lp in alive
                         for v in range(V)), key=lambda c: -c[1])[:2 * W]
    finished += [(seq, lp / penalty(len(seq))) for seq, lp in candidates if seq[-1] == eos]
    alive = [c for c in candidates if c[0][-1] != eos][:W]
  finished += [(seq, lp / penalty(T)) for seq, lp in alive]
  return sorted(finished, key=lambda c: -c[1])[:W]


@pytest.mark.parametrize("eos_bias,alpha", [(6.0, 5.0), (3.0, 0.6)])
def test_beam_search_equals_a_reference_that_never_stops_early(eos_bias, alpha):
  """2 beams of a 37-token decoder with a likely EOS, so that hypotheses finish early and
  the early stop (no alive beam can still beat the worst finished one) decides; a wrong
  bound there (at a strong length penalty) returned a worse ranking."""
  _, model, params = built("decoder", "rope", head_bias=True)
  params = nn.unbox(params)
  params = {**params, "head": {**params["head"], "bias": params["head"]["bias"].at[decode.EOS_ID].set(eos_bias)}}
  prompt, W, T = [1, 5, 6], 2, 8
  # One compiled shape: the row padded to its final length (causal, so the padding after the
  # read position changes nothing there).
  logp_at = jax.jit(lambda t, i: jax.nn.log_softmax(model.apply({"params": params}, t)[0, i]))
  logp_of = functools.lru_cache(None)(lambda seq: np.asarray(logp_at(jnp.asarray(
      [prompt + list(seq) + [0] * (T - len(seq))]), len(prompt) + len(seq) - 1)))
  want = _beam_search_reference(logp_of, 37, W, T, alpha, decode.EOS_ID)
  tokens_BWT, scores_BW = beam_search.beam_search(model, params, [prompt], max_new_tokens=T,
                                                  beam_size=W, length_penalty_alpha=alpha)
  np.testing.assert_allclose(scores_BW[0], [score for _, score in want], atol=1e-4)
  for w, (seq, _) in enumerate(want):
    assert tuple(tokens_BWT[0, w, :len(seq)]) == seq


def test_one_beam_without_penalty_is_greedy():
  _, model, params = built("decoder", "rope")
  greedy = decode.generate(model, params, PROMPTS, max_new_tokens=7, stop_tokens=())
  tokens_BWT, _ = beam_search.beam_search(model, params, PROMPTS, max_new_tokens=7, beam_size=1,
                                     length_penalty_alpha=0.0, eos_id=-1)
  np.testing.assert_array_equal(tokens_BWT[:, 0], greedy)


@pytest.mark.parametrize("call,message", [
    (lambda m, p: decode.generate(m, p, [[]], max_new_tokens=3), "empty prompt"),
    (lambda m, p: decode.generate(m, p, [], max_new_tokens=3), "no prompts"),
    (lambda m, p: decode.generate(m, p, [[1] * 30], max_new_tokens=3), "learned position"),
    (lambda m, p: decode.generate(m, p, [[1]], max_new_tokens=0), "max_new_tokens"),
    (lambda m, p: decode.generate(m, p, [[1, 37]], max_new_tokens=2), r"outside .*\[0, 37\)"),
    (lambda m, p: decode.Sampling(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (lambda m, p: decode.Sampling(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (lambda m, p: decode.Sampling(temperature=-1.0), "temperature"),
    (lambda m, p: decode.Sampling(top_k=-2), "top_k"),
    (lambda m, p: beam_search.beam_search(m, p, [[1]], max_new_tokens=3, beam_size=0),
     "beam_size must be"),
    (lambda m, p: decode.generate(m, p, [[1]], max_new_tokens=3, encoder_inputs=[[4]]),
     "decoder-only"),
])
def test_bad_input_gets_a_clear_error(call, message):
  _, model, params = built("decoder", "learned")
  with pytest.raises(ValueError, match=message):
    call(model, params)


def test_a_too_long_encoder_input_says_to_shorten_it():
  _, model, params = built("encoder_decoder", "learned")  # max_len 32
  for call in (decode.generate, functools.partial(beam_search.beam_search, beam_size=2)):
    with pytest.raises(ValueError, match=r"^encoder input \(33 tokens\) exceeds the learned "
                                         r"position table \(model.max_len=32\); shorten it.$"):
      call(model, params, None, max_new_tokens=2, encoder_inputs=[[4] * 33])
  assert decode.generate(model, params, None, max_new_tokens=2,
                         encoder_inputs=[[4] * 32]).shape[0] == 1


@pytest.mark.parametrize("kind,overrides,message", [
    ("encoder", {}, "has no next-token"),
    ("decoder", dict(attention="linear"), "does not support model.attention='linear'"),
    ("encoder_decoder", {}, "needs encoder_inputs"),
])
def test_unsupported_models_are_refused(kind, overrides, message):
  model = models.make_model(tiny(kind, **overrides))
  with pytest.raises(ValueError, match=message):
    decode.generate(model, {}, [[1]], max_new_tokens=2)


MESH_SCRIPT = """
import itertools, json, jax, numpy as np
from jax.sharding import Mesh
from transformer.schema import model_config, position_config
from transformer.inference import decode
from transformer.model import models
assert jax.device_count() == 2, jax.devices()
out = {}
# dense: XLA's steps; auto at head size 16: the cached CPU kernel's, partitioned by row.
for kind, attention in itertools.product(("decoder", "encoder_decoder"), ("dense", "auto")):
  cfg = model_config(kind=kind, vocab_size=37, d_model=32 if attention == "dense" else 64,
                     num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_len=32,
                     position=position_config("rope"), attention=attention)
  model = models.make_model(cfg)
  params = model.init(jax.random.key(0), *models.dummy_inputs(cfg, 1, 8))["params"]
  # Three rows over two devices: the split pads a row and drops it again.
  prompts = [[1, 5, 6], [1, 7, 8, 9, 10], [1, 4]] if kind == "decoder" else [[1]] * 3
  enc = None if kind == "decoder" else [[5, 6, 7, 2], [8, 9, 2], [3, 2]]
  run = lambda mesh: decode.generate(model, params, prompts, max_new_tokens=6, stop_tokens=(),
                                     encoder_inputs=enc, return_logits=True, mesh=mesh)
  (one, one_logits), (two, two_logits) = run(None), run(Mesh(np.array(jax.devices()), ("data",)))
  out[f"{kind}/{attention}"] = dict(equal=bool(np.array_equal(one, two)), shape=list(two.shape),
                   logits=float(np.abs(one_logits - two_logits).max()))
try:
  decode.generate(model, params, prompts, max_new_tokens=2, encoder_inputs=enc,
                  mesh=Mesh(np.array(jax.devices()).reshape(1, 2), ("data", "tensor")))
except ValueError as e:
  out["error"] = str(e)
print(json.dumps(out))
"""


def test_rows_split_over_a_mesh_decode_as_on_one_device():
  """generate(mesh=...) on two fake CPU devices: the same tokens and logits as one device,
  three rows (one padded in and dropped), decoder and encoder-decoder, XLA's steps and the
  cached CPU kernel's; a mesh that would shard the parameters is refused."""
  import json  # noqa: PLC0415
  import os  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root)
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True,
                        env=env, timeout=600, cwd=root)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  for kind in ("decoder/dense", "encoder_decoder/dense", "decoder/auto", "encoder_decoder/auto"):
    assert got[kind]["equal"] and got[kind]["shape"] == [3, 6], got
    assert got[kind]["logits"] < 1e-5, got
  assert "only its 'data' axis" in got["error"]
