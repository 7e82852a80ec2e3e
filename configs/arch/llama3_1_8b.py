"""Llama 3.1 8B: Llama 3 8B with "llama3" RoPE frequency scaling (factor 8 from 8k) to 128k.

  python -m transformer.inspect --config configs/arch/llama3_1_8b.py
"""

import ml_collections

from configs.arch.llama3_8b import llama3_8b_model
from transformer.schema import position_config


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=llama3_8b_model(
      max_len=131_072,
      position=position_config("rope", theta=500_000.0, scaling="llama3", scaling_factor=8.0,
                               original_max_len=8192, low_freq_factor=1.0,
                               high_freq_factor=4.0))))
