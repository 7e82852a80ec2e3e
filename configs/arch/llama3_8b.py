"""Llama 3 8B (Meta, 2024): 8k context, RoPE theta 500k without scaling.

  python -m transformer.inspect --config configs/arch/llama3_8b.py --length 131072
(Llama 3.1 8B, the same weights layout with a 128k context: configs/arch/llama3_1_8b.py.)

dtype and param_dtype bfloat16: the released weights' storage, for inspection, conversion and
inference. To train, override param_dtype to float32 (schema.PRECISIONS["bf16"]: bfloat16
compute, float32 weights and optimizer state).
"""

import ml_collections

from transformer.schema import model_config, position_config


def llama3_8b_model(**overrides):
  cfg = model_config(
      kind="decoder", vocab_size=128_256, d_model=4096, num_layers=32, num_heads=32,
      num_kv_heads=8, head_dim=128, d_ff=14_336, ffn="swiglu", norm="rmsnorm", norm_eps=1e-5,
      norm_position="pre", use_bias=False, tie_embeddings=False, max_len=8192,
      position=position_config("rope", theta=500_000.0), dtype="bfloat16",
      param_dtype="bfloat16", scan_layers=True)
  cfg.update(overrides)
  return cfg


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=llama3_8b_model()))
