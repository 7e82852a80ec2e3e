"""T5 small (Raffel et al. 2020; the original v1.0 `t5-small`).

Pre-norm RMS blocks without biases, ReLU, a bucketed relative bias shared by all layers of a
stack, unscaled q.k (the scale is folded into initialization), tied embeddings with the
final state scaled by d_model^-0.5.

  python -m transformer.inspect --config configs/arch/t5_small.py
"""

import ml_collections

from transformer.schema import model_config, position_config


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=model_config(
      kind="encoder_decoder", vocab_size=32_128, d_model=512, num_layers=6, num_heads=8,
      head_dim=64, d_ff=2048, ffn="relu", norm="rmsnorm", norm_eps=1e-6, norm_position="pre",
      use_bias=False, tie_embeddings=True, scale_tied_logits=True, qk_scale=1.0, max_len=512,
      position=position_config("t5_bias", num_buckets=32, max_distance=128),
      dropout_rate=0.1,
      attention_dropout_rate=0.1)))
