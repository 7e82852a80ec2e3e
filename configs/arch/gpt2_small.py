"""GPT-2 small (Radford et al. 2019; the 124M checkpoint `gpt2`).

  python -m transformer.inspect --config configs/arch/gpt2_small.py
"""

import ml_collections

from transformer.schema import model_config, position_config


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=model_config(
      kind="decoder", vocab_size=50_257, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
      ffn="gelu_tanh", norm="layernorm", norm_eps=1e-5, norm_position="pre", use_bias=True,
      tie_embeddings=True, max_len=1024, position=position_config("learned"),
      dropout_rate=0.1,
      attention_dropout_rate=0.1)))
