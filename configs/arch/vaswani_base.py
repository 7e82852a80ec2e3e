"""The original Transformer, base model (Vaswani et al. 2017, "Attention Is All You Need").

Encoder-decoder, post-norm, sinusoidal positions, ReLU feed-forward of 4x width, one
37,000-token BPE table shared by encoder input, decoder input and output (the paper's WMT
en-de setup), embeddings scaled by sqrt(d_model), dropout 0.1.

  python -m transformer.inspect --config configs/arch/vaswani_base.py
"""

import ml_collections

from transformer.schema import model_config, position_config


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=model_config(
      kind="encoder_decoder", vocab_size=37_000, d_model=512, num_layers=6, num_heads=8,
      d_ff=2048, ffn="relu", norm="layernorm", norm_eps=1e-6, norm_position="post",
      use_bias=True, tie_embeddings=True, scale_embeddings=True, max_len=4096,
      position=position_config("sinusoidal"), dropout_rate=0.1)))
