"""Bits per byte: the eval step's byte count and bpb against numpy, with bytes taken from
decoding the targets (bytes, sentencepiece and a Hugging Face BPE tokenizer)."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_run
from transformer import data
from transformer.data import sources
from transformer.model import models
from transformer.training import losses, step


def _hf_tokenizer_file(data_dir, directory) -> str:
  """A byte-level BPE trained on the tiny corpus, saved as a tokenizer.json."""
  import tokenizers as hf
  config = data.default_config()
  config.size, config.data_dir = "tiny", data_dir
  texts = [t for r in sources.load(config, "train") for t in sources.record_texts(r)]
  tok = hf.Tokenizer(hf.models.BPE())
  tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf.decoders.ByteLevel()
  tok.train_from_iterator(texts, hf.trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<mask>"],
      initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()))
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  return path


def _setup(tmp_path, data_dir, tokenizer_name, objective="lm"):
  overrides = {"data.seq_len": 512, "model.max_len": 512, "data.packing": False}
  if tokenizer_name == "sentencepiece":
    overrides.update({"data.tokenizer": "sentencepiece", "data.vocab_size": 400,
                      "data.tokenizer_train_chars": 30_000})
  elif tokenizer_name == "huggingface":
    overrides.update({"data.tokenizer": "huggingface", "data.tokenizer_path":
                      _hf_tokenizer_file(data_dir, str(tmp_path / "hf"))})
  config = tiny_run.tiny_config(data_dir, objective, **overrides)  # configs/lm.py, mlm.py
  config.model.vocab_size = 512
  tokenizer = data.get_tokenizer(config.data, str(tmp_path / "run"))
  return config, tokenizer


def _batch(config, tokenizer, split="validation", batch_size=4):
  return next(data.make_iterator(config.data, tokenizer, split=split, batch_size=batch_size,
                                 objective=config.objective.name, seed=0))


@pytest.mark.parametrize("tokenizer_name", ["bytes", "sentencepiece", "huggingface"])
def test_eval_bpb_matches_numpy_over_decoded_targets(tmp_path, data_dir, tokenizer_name):
  config, tokenizer = _setup(tmp_path, data_dir, tokenizer_name)
  batch = _batch(config, tokenizer)
  model = models.make_model(config.model)
  params = model.init(jax.random.key(0), jnp.asarray(batch["inputs"][:1]))["params"]
  eval_step = jax.jit(step.make_eval_step(losses.make_loss_fn(config.objective, model), "lm"))
  sums = jax.device_get(eval_step(params, batch, data.token_bytes(tokenizer)))

  # Reference: each row is one whole document (no packing, rows longer than any document),
  # so decoding its weighted targets gives back the document's text exactly.
  text_bytes = 0
  for inputs_L, targets_L, weights_L in zip(batch["inputs"], batch["targets"],
                                            batch["weights"]):
    if weights_L.sum() == 0:
      continue
    assert inputs_L[0] == tokenizer.bos_id and tokenizer.eos_id in targets_L  # a whole doc
    text = tokenizer.decode(targets_L[weights_L > 0])
    text_bytes += len(text.encode("utf-8"))
  logits_BLV = np.asarray(model.apply({"params": params}, batch["inputs"],
                                      segment_ids=batch["segment_ids"],
                                      positions=batch["positions"], deterministic=True),
                          np.float64)
  log_p_BLV = logits_BLV - np.log(np.exp(logits_BLV - logits_BLV.max(-1, keepdims=True))
                                  .sum(-1, keepdims=True)) - logits_BLV.max(-1, keepdims=True)
  nll = -np.sum(np.take_along_axis(log_p_BLV, batch["targets"][..., None], -1)[..., 0]
                * batch["weights"])
  assert sums["byte_sum"] == text_bytes
  np.testing.assert_allclose(sums["nll_sum"], nll, rtol=1e-4)
  bpb = sums["nll_sum"] / sums["byte_sum"] / math.log(2)
  np.testing.assert_allclose(bpb, nll / text_bytes / math.log(2), rtol=1e-4)
  if tokenizer_name != "bytes":  # several bytes per token: bpb well below loss / ln 2
    assert sums["byte_sum"] > 1.5 * sums["weight_sum"]


def test_bytes_tokenizer_counts_one_byte_per_text_token_for_every_objective(tmp_path, data_dir):
  for objective in ("lm", "mlm"):
    config, tokenizer = _setup(tmp_path, data_dir, "bytes", objective=objective)
    batch = _batch(config, tokenizer)
    table = data.token_bytes(tokenizer)
    counted = float(losses.target_bytes(objective, batch, table["token_bytes_2V"],
                                        table["bos_id"]))
    text = (batch["targets"] >= 4) & (batch["weights"] > 0)  # EOS and specials: no bytes
    assert counted == text.sum() > 0, objective
  config = tiny_run.tiny_config(data_dir, "seq2seq")
  tokenizer = data.get_tokenizer(config.data)
  batch = _batch(config, tokenizer, split="train")
  table = data.token_bytes(tokenizer)
  expected = sum(len(tokenizer.decode(t[w > 0]).encode())
                 for t, w in zip(batch["decoder_targets"], batch["decoder_weights"]))
  assert float(losses.target_bytes("seq2seq", batch, table["token_bytes_2V"],
                                   table["bos_id"])) == expected > 0


def test_sentencepiece_first_token_drops_its_dummy_prefix(tmp_path, data_dir):
  _, tokenizer = _setup(tmp_path, data_dir, "sentencepiece")
  table_2V = tokenizer.token_bytes_2V
  for text in ["a cat", " lead space", "x\n\ty  z", "日本語 é"]:
    ids = tokenizer.encode(text)
    assert table_2V[1, ids[0]] + table_2V[0, ids[1:]].sum() == len(text.encode()), text
