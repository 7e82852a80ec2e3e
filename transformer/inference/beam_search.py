"""Beam search on the KV cache of transformer/inference/decode.py: every hypothesis is a batch
row of one cache, reordered by `_take_rows` as beams are kept; the loop is one compiled program.
"""

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.inference.decode import DecodeState, EOS_ID, PAD_ID, _encoded, _prepare, prefill, step



def length_penalty(length, alpha):
  """GNMT's ((5 + length) / 6) ** alpha (Wu et al. 2016): alpha 0 ranks by total log-prob;
  larger alpha favours longer hypotheses."""
  return ((5.0 + length) / 6.0) ** alpha


def _take_rows(state: DecodeState, rows_R) -> DecodeState:
  """The state of the given batch rows (cache leaves are [..., B, S, K, H]: scanned stacks
  add a leading layer axis)."""
  take = lambda x, axis: None if x is None else jnp.take(x, rows_R, axis=axis)
  return state.replace(
      cache=jax.tree.map(lambda x: take(x, x.ndim - 4), state.cache),
      start_B=take(state.start_B, 0), encoded_BSD=take(state.encoded_BSD, 0),
      encoder_segment_ids_BS=take(state.encoder_segment_ids_BS, 0))


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "beam_size"))
def _beam_search(model, params, tokens_BP, start_B, enc_tokens, enc_seg, eos_id, alpha, *,
                 max_new_tokens, beam_size):
  B, P = tokens_BP.shape
  W, T = beam_size, max_new_tokens
  encoded, enc_seg = _encoded(model, params, enc_tokens, enc_seg)
  logits_BPV, state = prefill(model, params, tokens_BP, start_B, P + T, encoded, enc_seg)
  # One prefill per prompt; its rows are then copied to the W beams (row b * W + w).
  state = _take_rows(state, jnp.repeat(jnp.arange(B), W))
  V = logits_BPV.shape[-1]
  neg_inf = jnp.float32(-jnp.inf)

  def expand(carry, logp_BWV, t):
    """Extend every alive beam by every token; keep the best W that did not end and merge
    the ones that did into the finished set (scored with the length penalty)."""
    alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, _ = carry
    cand_BWV = alive_lp_BW[..., None] + logp_BWV
    top_lp_BC, top_i_BC = jax.lax.top_k(cand_BWV.reshape(B, W * V), 2 * W)
    parent_BC, token_BC = top_i_BC // V, (top_i_BC % V).astype(jnp.int32)
    seq_BCT = jnp.take_along_axis(alive_BWT, parent_BC[..., None], axis=1).at[:, :, t].set(
        token_BC)
    ended_BC = token_BC == eos_id
    # Finished: merge with the previous best W.
    score_BC = jnp.where(ended_BC, top_lp_BC / length_penalty(t + 1.0, alpha), neg_inf)
    fin_score_BW, keep = jax.lax.top_k(jnp.concatenate([fin_score_BW, score_BC], 1), W)
    fin_BWT = jnp.take_along_axis(jnp.concatenate([fin_BWT, seq_BCT], 1), keep[..., None], 1)
    # Alive: the best W candidates that did not end.
    alive_lp_BW, keep = jax.lax.top_k(jnp.where(ended_BC, neg_inf, top_lp_BC), W)
    alive_BWT = jnp.take_along_axis(seq_BCT, keep[..., None], axis=1)
    parent_BW = jnp.take_along_axis(parent_BC, keep, axis=1)
    return alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, parent_BW

  def done(carry, t):
    """No alive beam can still beat the worst of the W finished: log-probs only fall, and
    with alpha >= 0 the kindest penalty is the one at the longest length."""
    _, alive_lp_BW, _, fin_score_BW, _ = carry
    best_possible_B = alive_lp_BW[:, 0] / length_penalty(jnp.float32(T), alpha)
    return (t >= T) | jnp.all(fin_score_BW[:, -1] >= best_possible_B)

  first_lp_BV = jax.nn.log_softmax(logits_BPV[:, -1].astype(jnp.float32))
  init = (jnp.full((B, W, T), PAD_ID, jnp.int32),
          jnp.concatenate([jnp.zeros((B, 1)), jnp.full((B, W - 1), -jnp.inf)], 1),  # 1 beam
          jnp.full((B, W, T), PAD_ID, jnp.int32), jnp.full((B, W), -jnp.inf),
          jnp.zeros((B, W), jnp.int32))
  carry = expand(init, jnp.broadcast_to(first_lp_BV[:, None], (B, W, V)), 0)

  def body(loop):
    t, carry, state = loop
    alive_BWT, parent_BW = carry[0], carry[4]
    # The cache follows each surviving beam's parent.
    state = _take_rows(state, (jnp.arange(B)[:, None] * W + parent_BW).reshape(-1))
    logits_RV, state = step(model, params, state, alive_BWT[:, :, t - 1].reshape(-1))
    logp_BWV = jax.nn.log_softmax(logits_RV.astype(jnp.float32)).reshape(B, W, V)
    return t + 1, expand(carry, logp_BWV, t), state

  t, carry, _ = jax.lax.while_loop(lambda loop: ~done(loop[1], loop[0]), body,
                                   (jnp.int32(1), carry, state))
  alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, _ = carry
  # The beams still alive compete with the finished ones, scored at the length reached, as
  # Hugging Face's beam search finalizes them. Returning the finished ones alone (T5X's
  # rule) lets one early EOS of tiny probability win over every hypothesis that
  # max_new_tokens cut. When `done` ended the loop early, no alive beam can enter the best W.
  alive_score_BW = alive_lp_BW / length_penalty(t.astype(jnp.float32), alpha)
  scores_BW, keep = jax.lax.top_k(jnp.concatenate([fin_score_BW, alive_score_BW], 1), W)
  tokens_BWT = jnp.take_along_axis(jnp.concatenate([fin_BWT, alive_BWT], 1), keep[..., None], 1)
  return tokens_BWT, scores_BW


def beam_search(model, params, prompts: Sequence[Sequence[int]] | None, *,
                max_new_tokens: int, beam_size: int, length_penalty_alpha: float = 0.6,
                eos_id: int = EOS_ID, encoder_inputs=None):
  """(tokens_BWT, scores_BW), best first, both numpy.

  A hypothesis is finished when it emits eos_id (kept, padded after); its score is
  log p(tokens) / length_penalty(number of tokens, alpha). Hypotheses that reach
  max_new_tokens without eos_id are ranked with the finished ones, scored the same way at
  that length. Prompts and encoder_inputs as for `generate`.
  """
  if not (isinstance(beam_size, (int, np.integer)) and beam_size >= 1):
    raise ValueError(f"beam_size must be an integer >= 1, got {beam_size}.")
  if not length_penalty_alpha >= 0:
    raise ValueError(f"length_penalty_alpha must be >= 0, got {length_penalty_alpha}.")
  model, tokens_BP, start_B, (enc_tokens, enc_seg) = _prepare(model, prompts, max_new_tokens,
                                                              encoder_inputs)
  tokens_BWT, scores_BW = _beam_search(
      model, params, tokens_BP, start_B, enc_tokens, enc_seg, jnp.int32(eos_id),
      jnp.float32(length_penalty_alpha), max_new_tokens=max_new_tokens, beam_size=beam_size)
  return np.asarray(tokens_BWT), np.asarray(scores_BW)
