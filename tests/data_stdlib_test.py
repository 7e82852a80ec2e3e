"""The python_stdlib corpus trains: a brief LM run beats the validation unigram entropy."""

import numpy as np
import pytest

from helpers.tiny_run import tiny_config
from transformer import data
from transformer.training import loop

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)


def test_brief_lm_on_python_stdlib_beats_unigram_entropy(tmp_path):
  config = tiny_config(str(tmp_path / "tfds"), **{"data.name": "python_stdlib"})
  config.data.seq_len = 128
  config.model.update(dict(d_model=128, num_heads=4, d_ff=512, max_len=128))
  config.train.update(dict(steps=300, batch_size=16, log_every=100, eval_every=300,
                           checkpoint_every=300, eval_batches=4))
  config.opt.lr = 3e-3
  config.opt.warmup_steps = 30
  summary = loop.train_and_evaluate(config, str(tmp_path / "run"))
  tokenizer = data.get_tokenizer(config.data, None)
  entropy = data.unigram_entropy(config.data, tokenizer, "validation", max_records=20)
  assert np.isfinite(summary["final_eval_loss"])
  assert summary["final_eval_loss"] < entropy - 0.2, (summary["final_eval_loss"], entropy)
