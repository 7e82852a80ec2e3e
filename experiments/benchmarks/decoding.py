"""What the decoding benchmarks share (generation.py, cache_dtype.py): the W1 decoder, the
growth exponent and the agreement count. No flags here, so both can import it (each defines
its own)."""

import numpy as np

from transformer.schema import model_config, position_config


def w1(max_len: int, **overrides):
  """W1 as a decoder: vocab 256, d_model 256, 4 layers, 4 heads, d_ff 1024 GELU, learned
  positions, fp32."""
  return model_config(**{**dict(kind="decoder", vocab_size=256, d_model=256, num_layers=4,
                                num_heads=4, d_ff=1024, ffn="gelu",
                                position=position_config("learned"), max_len=max_len,
                                dtype="float32"), **overrides})


def exponent(t1: float, t2: float, T1: int, T2: int) -> float:
  """k in time ~ T^k between (T1, t1) and (T2, t2): 1 is a per-token cost that does not grow."""
  return float(np.log(t2 / t1) / np.log(T2 / T1))


def agreeing(a_BT, b_BT) -> int:
  """New tokens two greedy decodings share: each row's common prefix (they part at the first
  float near-tie), summed over rows."""
  return sum(int(np.argmin(np.append(a == b, False))) for a, b in zip(a_BT, b_BT))
