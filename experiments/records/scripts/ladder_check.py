"""Is there a size ladder whose depth and width never fall, under issue 18's shape rule?

  PYTHONPATH=. python experiments/records/scripts/ladder_check.py

The rule (configs/scaling.py `_shape_rule`): >= 2 layers and 2 heads, head_dim 16 below d_model
64 and 32 above, d_ff = 4 d_model, tied byte embeddings (V = 256), sizes counted in total
parameters, at most 10^0.2 apart. Prints the smallest width step at fixed depth and whether any
chain from <= 5e4 to >= 8e5 parameters has non-decreasing depth and width with every step
<= 10^0.2 (experiments/scaling/README.md, "Why the grid does not pin a down better").
"""

import math

from experiments.scaling import shapes

WIDTHS = [32, 48] + list(range(64, 512, 32))


def total(layers: int, width: int) -> int:
  hd = 16 if width < 64 else 32
  return shapes.param_counts(dict(d_model=width, num_layers=layers, num_heads=width // hd,
                                  num_kv_heads=0, head_dim=hd, d_ff=4 * width, vocab_size=256,
                                  ffn="gelu", tie_embeddings=True))["total"]


def main() -> None:
  steps = [(total(L, b) / total(L, a), L, a, b) for L in range(2, 20)
           for a, b in zip(WIDTHS, WIDTHS[1:]) if b <= 128]
  print("smallest width step at fixed depth up to d_model 128: %.3fx (L=%d, %d -> %d)" % min(steps))
  shapes_ = sorted((total(L, d), L, d) for L in range(2, 20) for d in WIDTHS)
  reach = {}  # index -> a shortest monotone chain ending there, starting at <= 5e4
  for i, (n, L, d) in enumerate(shapes_):
    if n <= 5e4:
      reach[i] = [(n, L, d)]
    for j in range(i):
      m, L2, d2 = shapes_[j]
      if j in reach and L2 <= L and d2 <= d and m < n and math.log10(n / m) <= 0.2:
        if i not in reach or len(reach[j]) + 1 < len(reach[i]):
          reach[i] = reach[j] + [(n, L, d)]
  ends = [reach[i] for i in reach if shapes_[i][0] >= 8e5]
  print("monotone chain 5e4 -> 8e5 with steps <= 10^0.2:",
        min(ends, key=len) if ends else "none exists")


if __name__ == "__main__":
  main()
