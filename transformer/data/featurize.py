"""Training objectives: one record -> unpadded token arrays -> named model inputs.

An objective is three small functions (a registry entry):
  featurize(record, tokenizer, rng, data_config) -> dict of 1-D arrays of equal role
  split(features, seq_len) -> list of features that each fit in seq_len
  finalize(row) -> the model-facing dict for one packed or padded row
Packing itself (pipeline.py) is objective-agnostic: it packs every feature key and
adds `<key>_segment_ids` / `<key>_positions`, which finalize renames.
"""

import dataclasses
from typing import Callable

import numpy as np

from transformer.data import tokenizers

# Joins a seq2seq record into one text for decoder-only (lm) and encoder (mlm) training;
# "12+34 = 46", "k1:v2 ? k1 = v2". An lm prompt at eval time is inputs + PROMPT_SEPARATOR.
PROMPT_SEPARATOR = " = "
MLM_RATE = 0.15           # fraction of real tokens selected for prediction
MLM_MASK, MLM_RANDOM = 0.8, 0.1  # of the selected: replaced by mask / by a random token


def lm_tokens(record, tokenizer) -> tuple[np.ndarray, int]:
  """BOS + tokens + EOS, and how many tokens after BOS are prompt (0 for plain text)."""
  if "inputs" in record:
    prompt = tokenizer.encode(record["inputs"] + PROMPT_SEPARATOR)
    body = prompt + tokenizer.encode_continuation(record["targets"])
  else:
    prompt, body = [], tokenizer.encode(record["text"])
  tokens_N = np.asarray([tokenizer.bos_id] + body + [tokenizer.eos_id], np.int32)
  return tokens_N, len(prompt)


def lm(record, tokenizer, rng, data_config):
  """Next-token prediction within one document (targets never cross documents)."""
  del rng
  tokens_N, prompt_len = lm_tokens(record, tokenizer)
  weights_N = np.ones(len(tokens_N) - 1, np.float32)
  if not data_config.prompt_loss:
    weights_N[:prompt_len] = 0.0  # target j is token j+1; tokens 1..prompt_len are the prompt
  return {"inputs": tokens_N[:-1], "targets": tokens_N[1:], "weights": weights_N}


def mlm(record, tokenizer, rng, data_config):
  """BERT masking: select MLM_RATE of real tokens; 80% -> mask, 10% -> random, 10% kept."""
  del data_config
  if "inputs" in record:
    record = {"text": record["inputs"] + PROMPT_SEPARATOR + record["targets"]}
  targets_N, _ = lm_tokens(record, tokenizer)
  real_R = np.arange(1, len(targets_N) - 1)  # BOS and EOS are never selected
  num_selected = min(len(real_R), max(1, round(MLM_RATE * len(real_R))))
  selected_S = rng.choice(real_R, size=num_selected, replace=False)
  action_S = rng.random(num_selected)
  inputs_N = targets_N.copy()
  inputs_N[selected_S[action_S < MLM_MASK]] = tokenizer.mask_id
  randomized = selected_S[(action_S >= MLM_MASK) & (action_S < MLM_MASK + MLM_RANDOM)]
  inputs_N[randomized] = rng.integers(tokenizers.NUM_SPECIAL, tokenizer.vocab_size,
                                      size=len(randomized))
  weights_N = np.zeros(len(targets_N), np.float32)
  weights_N[selected_S] = 1.0
  return {"inputs": inputs_N, "targets": targets_N, "weights": weights_N}


def seq2seq(record, tokenizer, rng, data_config):
  """Encoder gets inputs + EOS; decoder reads BOS + targets and predicts targets + EOS."""
  del rng
  encoder_N = np.asarray(tokenizer.encode(record["inputs"]) + [tokenizer.eos_id], np.int32)
  target = tokenizer.encode(record["targets"])
  decoder_inputs_M = np.asarray([tokenizer.bos_id] + target, np.int32)
  decoder_targets_M = np.asarray(target + [tokenizer.eos_id], np.int32)
  longest = max(len(encoder_N), len(decoder_targets_M))
  if longest > data_config.seq_len:
    # Truncating an answer would silently make the task unsolvable; say so instead.
    raise ValueError(f"a seq2seq example needs {longest} tokens but data.seq_len="
                     f"{data_config.seq_len}; raise data.seq_len")
  return {"encoder_inputs": encoder_N, "decoder_inputs": decoder_inputs_M,
          "decoder_targets": decoder_targets_M,
          "decoder_weights": np.ones(len(decoder_targets_M), np.float32)}


def split_chunks(features, seq_len):
  """Cuts long documents into consecutive seq_len pieces (each becomes its own segment)."""
  n = len(next(iter(features.values())))
  return [{k: v[start:start + seq_len] for k, v in features.items()}
          for start in range(0, n, seq_len)]


def split_whole(features, seq_len):
  del seq_len  # seq2seq featurize already refused examples that do not fit
  return [features]


def finalize_single(row):
  return {"inputs": row["inputs"], "targets": row["targets"],
          "segment_ids": row["inputs_segment_ids"], "positions": row["inputs_positions"],
          "weights": row["weights"]}


def finalize_seq2seq(row):
  return {"encoder_inputs": row["encoder_inputs"],
          "encoder_segment_ids": row["encoder_inputs_segment_ids"],
          "encoder_positions": row["encoder_inputs_positions"],
          "decoder_inputs": row["decoder_inputs"], "decoder_targets": row["decoder_targets"],
          "decoder_segment_ids": row["decoder_inputs_segment_ids"],
          "decoder_positions": row["decoder_inputs_positions"],
          "decoder_weights": row["decoder_weights"]}


@dataclasses.dataclass(frozen=True)
class Objective:
  featurize: Callable
  split: Callable
  finalize: Callable
  keys: tuple[str, ...]  # what featurize returns; all are packed to seq_len
  needs_seq2seq: bool = False


_SINGLE_KEYS = ("inputs", "targets", "weights")
_SEQ2SEQ_KEYS = ("encoder_inputs", "decoder_inputs", "decoder_targets", "decoder_weights")


OBJECTIVES = {
    "lm": Objective(lm, split_chunks, finalize_single, _SINGLE_KEYS),
    "mlm": Objective(mlm, split_chunks, finalize_single, _SINGLE_KEYS),
    # Packs like the others: encoder segment k and decoder segment k are the same example.
    "seq2seq": Objective(seq2seq, split_whole, finalize_seq2seq, _SEQ2SEQ_KEYS,
                         needs_seq2seq=True),
}


def get_objective(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; valid: {sorted(OBJECTIVES)}")
  return OBJECTIVES[name]
