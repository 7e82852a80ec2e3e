"""Losses of the training objectives: causal LM, masked LM and sequence-to-sequence.

Every objective returns *sums* over real tokens, never means: the train step adds them over
micro-batches and devices and divides once by the total count of real (non-pad) tokens, so a
loss is the same number however the batch is split, packed or accumulated.

Batches are dicts of arrays as the data layer yields them (lm/mlm: inputs, targets,
segment_ids, positions, weights; seq2seq: encoder_* and decoder_* keys).
"""

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

# Which model kind each objective trains; a mismatch is a config error, caught before compute.
MODEL_KIND = {"lm": "decoder", "mlm": "encoder", "seq2seq": "encoder_decoder"}


def cross_entropy(logits_BLV, targets_BL, weights_BL, label_smoothing=0.0, z_loss=0.0):
  """Weighted sums: (training loss, plain NLL, correct predictions).

  The training loss adds label smoothing (mixing the target with the uniform distribution)
  and z-loss (z_loss * log(Z)^2, PaLM's guard against logits drifting upward). The plain
  NLL is what eval and perplexity report, so runs with different smoothing compare.
  """
  logits_BLV = logits_BLV.astype(jnp.float32)
  weights_BL = weights_BL.astype(jnp.float32)
  log_z_BL = jax.nn.logsumexp(logits_BLV, axis=-1)
  target_logit_BL = jnp.take_along_axis(logits_BLV, targets_BL[..., None], axis=-1)[..., 0]
  nll_BL = log_z_BL - target_logit_BL
  loss_BL = nll_BL
  if label_smoothing:
    uniform_nll_BL = log_z_BL - jnp.mean(logits_BLV, axis=-1)
    loss_BL = (1.0 - label_smoothing) * nll_BL + label_smoothing * uniform_nll_BL
  if z_loss:
    loss_BL = loss_BL + z_loss * jnp.square(log_z_BL)
  correct_BL = (jnp.argmax(logits_BLV, axis=-1) == targets_BL).astype(jnp.float32)
  return (jnp.sum(loss_BL * weights_BL), jnp.sum(nll_BL * weights_BL),
          jnp.sum(correct_BL * weights_BL))


def _sums(loss, nll, correct, weights):
  return loss, {"nll_sum": nll, "correct_sum": correct, "weight_sum": jnp.sum(weights)}


def _single(cfg, model):
  """Causal LM (decoder) and masked LM (encoder) read the same batch layout; for MLM the data
  layer has already masked `inputs` (15%, 80/10/10) and zeroed `weights` off the selection."""
  def loss_fn(params, batch, rng, deterministic):
    logits_BLV = model.apply({"params": params}, batch["inputs"],
                             segment_ids=batch["segment_ids"], positions=batch["positions"],
                             deterministic=deterministic, rngs={"dropout": rng})
    weights_BL = batch["weights"]
    return _sums(*cross_entropy(logits_BLV, batch["targets"], weights_BL,
                                cfg.label_smoothing, cfg.z_loss), weights_BL)
  return loss_fn


def _seq2seq(cfg, model):
  def loss_fn(params, batch, rng, deterministic):
    # Teacher forcing: the decoder reads the shifted-right targets the data layer provides.
    logits_BLV = model.apply(
        {"params": params}, batch["encoder_inputs"], batch["decoder_inputs"],
        encoder_segment_ids=batch["encoder_segment_ids"],
        decoder_segment_ids=batch["decoder_segment_ids"],
        encoder_positions=batch["encoder_positions"],
        decoder_positions=batch["decoder_positions"],
        deterministic=deterministic, rngs={"dropout": rng})
    weights_BL = batch["decoder_weights"]
    return _sums(*cross_entropy(logits_BLV, batch["decoder_targets"], weights_BL,
                                cfg.label_smoothing, cfg.z_loss), weights_BL)
  return loss_fn


OBJECTIVES: dict[str, Callable] = {"lm": _single, "mlm": _single, "seq2seq": _seq2seq}


def target_bytes(objective_name: str, batch, token_bytes_2V, bos_id):
  """The UTF-8 bytes of the text the weighted targets decode to: bits per byte's denominator,
  from the tokenizer's table (tokenizers.token_bytes_2V) without decoding.

  Row 1 of the table is for a document's first token (whose previous token is BOS): a
  sentencepiece-style dummy-prefix space is not text. Specials (BOS, EOS, pad) are no bytes:
  EOS is still predicted and its loss counts, so bpb = all predicted nats / text bytes / ln 2.
  """
  if objective_name == "seq2seq":
    targets_BL, weights_BL = batch["decoder_targets"], batch["decoder_weights"]
    previous_BL = batch["decoder_inputs"]
  elif objective_name == "lm":
    targets_BL, weights_BL, previous_BL = batch["targets"], batch["weights"], batch["inputs"]
  else:  # mlm: targets is the whole unmasked row, so a token's predecessor is its neighbour
    targets_BL, weights_BL = batch["targets"], batch["weights"]
    previous_BL = jnp.pad(targets_BL[:, :-1], ((0, 0), (1, 0)))
  bytes_BL = jnp.where(previous_BL == bos_id, token_bytes_2V[1][targets_BL],
                       token_bytes_2V[0][targets_BL])
  return jnp.sum(bytes_BL.astype(jnp.float32) * weights_BL.astype(jnp.float32))


def check_config(objective_config: ml_collections.ConfigDict, model_kind: str) -> None:
  name = objective_config.name
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective.name {name!r}; valid: {sorted(OBJECTIVES)}")
  if MODEL_KIND[name] != model_kind:
    raise ValueError(f"objective {name!r} trains a {MODEL_KIND[name]!r} model, "
                     f"but model.kind is {model_kind!r}")
  if not 0.0 <= objective_config.label_smoothing < 1.0:
    raise ValueError(f"objective.label_smoothing must be in [0, 1), "
                     f"got {objective_config.label_smoothing}")


def make_loss_fn(objective_config, model) -> Callable:
  """loss_fn(params, batch, rng, deterministic) -> (loss_sum, {nll_sum, correct_sum,
  weight_sum}), all sums over the batch's real tokens."""
  return OBJECTIVES[objective_config.name](objective_config, model)

