"""Experiment configs: each dataset a config's docstring offers fits its settings as written."""

import pytest

from transformer import data

from configs import seq2seq

# Every dataset pairing the seq2seq docstring advertises.
SEQ2SEQ_ARGS = [f"size=xs,task={task}" for task in data.TASKS] + ["size=xs,dataset=kv_retrieval"]


@pytest.mark.parametrize("arg", SEQ2SEQ_ARGS)
def test_seq2seq_config_fits_every_dataset_it_offers(tmp_path, arg):
  # Seq2seq examples are never truncated: a seq_len shorter than the longest example is an
  # error at the first batch, so the config's seq_len must hold its dataset's examples.
  config = seq2seq.get_config(arg)
  config.data.update(data_dir=str(tmp_path), size="tiny")  # tiny: same lengths, fewer records
  tokenizer = data.get_tokenizer(config.data)
  assert tokenizer.vocab_size <= config.model.vocab_size
  assert config.data.seq_len <= config.model.max_len
  for split in ("train", "validation"):
    batch = next(data.make_iterator(config.data, tokenizer, split=split, batch_size=4,
                                    objective=config.objective.name, seed=0))
    assert batch["decoder_weights"].sum() > 0
