"""The bf16 precision preset: bfloat16 compute on float32 weights and optimizer state, and a
tiny run in it learning as well as float32 (on CPU, where bfloat16 matmuls are emulated)."""

import pytest

from configs import lm
from helpers import tiny_run
from transformer import schema


def test_the_preset_keeps_weights_and_optimizer_state_in_float32():
  config = lm.get_config("size=xs,precision=bf16")
  assert (config.model.dtype, config.model.param_dtype) == ("bfloat16", "float32")
  assert lm.get_config("size=xs").model.dtype == "float32"
  with pytest.raises(ValueError, match="unknown precision"):
    schema.precision_config("fp8")


@pytest.mark.slow
def test_bf16_compute_learns_within_a_few_percent_of_fp32(tmp_path, data_dir):
  from transformer.training import loop
  finals = {}
  for name in ("fp32", "bf16"):
    config = tiny_run.tiny_config(data_dir, **{
        "train.steps": 150, "train.eval_every": 150, "train.checkpoint_every": 150,
        "train.eval_batches": 4, "train.log_every": 50, "opt.warmup_steps": 10,
        "opt.lr": 3e-3})
    config.model.update(schema.precision_config(name))
    summary = loop.train_and_evaluate(config, str(tmp_path / name))
    finals[name] = summary["final_eval_loss"]
  print("final eval loss", finals)
  assert finals["fp32"] < 2.5, finals  # it learned (the grammar corpus' unigram entropy: 2.95 nats)
  assert abs(finals["bf16"] - finals["fp32"]) < 0.05 * finals["fp32"], finals
