"""Scoring text with a trained decoder: per-token losses and continuation log-probabilities.

The experiments (length extrapolation, agreement and retrieval probes) all reduce to these
two questions, asked of a full forward pass:

  scorer = Scorer(model_config, params)
  nll_BL, correct_BL = scorer.token_losses(tokens_BL)      # target j is token j + 1
  logp = scorer.continuation_logprobs(tokenizer, prefixes, continuations)
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.model import models, positions


class Scorer:
  """A decoder with its parameters; one compiled forward pass per distinct input shape."""

  def __init__(self, model_config: ml_collections.ConfigDict, params):
    if model_config.kind != "decoder":
      raise ValueError(f"Scorer needs a decoder, got model.kind={model_config.kind!r}.")
    self.config = model_config
    self.model = models.make_model(model_config)
    self.params = params

  @functools.partial(jax.jit, static_argnums=0)
  def _losses(self, params, inputs_BL, targets_BL, segment_ids_BL):
    logits = self.model.apply({"params": params}, inputs_BL, segment_ids=segment_ids_BL)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, targets_BL[..., None], axis=-1)[..., 0]
    return nll, jnp.argmax(logits, axis=-1) == targets_BL

  def __hash__(self):  # jit's static self: one compiled cache per Scorer object
    return id(self)

  def __eq__(self, other):
    return self is other

  def token_losses(self, tokens_BL, segment_ids_BL=None, targets_BL=None):
    """(nll, argmax == target) per target position, numpy. Without `targets_BL` the targets
    are the tokens shifted by one ([B, L - 1]); with it, `tokens_BL` are all inputs."""
    tokens_BL = np.asarray(tokens_BL, np.int32)
    if segment_ids_BL is None:
      segment_ids_BL = np.ones_like(tokens_BL)
    segment_ids_BL = np.asarray(segment_ids_BL, np.int32)
    if targets_BL is None:
      tokens_BL, targets_BL = tokens_BL[:, :-1], tokens_BL[:, 1:]
      segment_ids_BL = segment_ids_BL[:, :-1]
    nll, correct = self._losses(self.params, jnp.asarray(tokens_BL),
                                jnp.asarray(targets_BL, jnp.int32), jnp.asarray(segment_ids_BL))
    return np.asarray(nll), np.asarray(correct)

  def continuation_scores(self, tokenizer, prefixes, continuations, batch_size: int = 32,
                          pad_to: int = 0):
    """For each (prefix, continuation): the summed log-probability of the continuation's
    tokens after BOS + prefix, and whether greedy decoding would produce every one of them.

    Rows are right-padded (segment 0) to a shared length, at least `pad_to`, rounded to a
    multiple of 16 so a handful of shapes is compiled.
    """
    rows, spans = [], []
    for prefix, cont in zip(prefixes, continuations):
      head = [tokenizer.bos_id] + tokenizer.encode(prefix)
      tail = tokenizer.encode_continuation(cont)
      if not tail:
        raise ValueError(f"empty continuation after prefix {prefix[:40]!r}")
      rows.append(head + tail)
      spans.append((len(head), len(head) + len(tail)))
    longest = max(map(len, rows))
    length = -(-max(longest, pad_to) // 16) * 16
    # The model reads length - 1 inputs: rounding up may not pass a learned position table
    # that the rows themselves fit (padding is masked, so the scores do not change).
    table = positions.make_scheme(self.config).max_length()
    length = max(longest, min(length, table + 1))
    logps, exact = [], []
    for start in range(0, len(rows), batch_size):
      chunk = rows[start:start + batch_size]
      tokens = np.zeros((batch_size, length), np.int32)
      seg = np.zeros((batch_size, length), np.int32)
      for i, row in enumerate(chunk):
        tokens[i, :len(row)] = row
        seg[i, :len(row)] = 1
      nll, correct = self.token_losses(tokens, seg)
      for i in range(len(chunk)):
        a, b = spans[start + i]
        # Target index j predicts token j + 1, so tokens a..b-1 are targets a-1..b-2.
        logps.append(-float(nll[i, a - 1:b - 1].sum()))
        exact.append(bool(correct[i, a - 1:b - 1].all()))
    return np.asarray(logps), np.asarray(exact)
