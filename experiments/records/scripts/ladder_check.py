"""Is there a size ladder whose depth and width never fall, under issue 18's shape rule?

  PYTHONPATH=. python experiments/records/scripts/ladder_check.py

The rule (configs/scaling.py `_shape_rule`): >= 2 layers and 2 heads, head_dim 16 below d_model
64 and 32 above, d_ff = 4 d_model, tied byte embeddings (V = 256), sizes counted in total
parameters, at most 10^0.2 apart. The issue fixes head_dim only below d_model 64, so the search
also admits head_dim 16 above it (widths in steps of 16 throughout). Prints the smallest width
step at fixed depth and whether any chain from <= 5e4 to >= 8e5 parameters has non-decreasing
depth and width with every step <= 10^0.2 (experiments/scaling/README.md, "Why the grid does
not pin a down better"), with the project's head_dim and with head_dim 16 allowed everywhere.
"""

import math

from experiments.scaling import shapes

WIDTHS = [32, 48] + list(range(64, 512, 32))
FINE_WIDTHS = list(range(32, 512, 16))  # head_dim 16 at every width


def total(layers: int, width: int, hd: int = 0) -> int:
  hd = hd or (16 if width < 64 else 32)
  return shapes.param_counts(dict(d_model=width, num_layers=layers, num_heads=width // hd,
                                  num_kv_heads=0, head_dim=hd, d_ff=4 * width, vocab_size=256,
                                  ffn="gelu", tie_embeddings=True))["total"]


def shortest_chain(shapes_: list[tuple]):
  """A shortest chain of (total, layers, width) from <= 5e4 to >= 8e5 with non-decreasing depth
  and width and steps <= 10^0.2, or None."""
  shapes_ = sorted(shapes_)
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
  return min(ends, key=len) if ends else None


def main() -> None:
  steps = [(total(L, b) / total(L, a), L, a, b) for L in range(2, 20)
           for a, b in zip(WIDTHS, WIDTHS[1:]) if b <= 128]
  print("smallest width step at fixed depth up to d_model 128: %.3fx (L=%d, %d -> %d)" % min(steps))
  fine = [(total(L, b, 16) / total(L, a, 16), L, a, b) for L in range(2, 20)
          for a, b in zip(FINE_WIDTHS, FINE_WIDTHS[1:]) if a == 48]
  print("with head_dim 16, smallest step at fixed depth from d_model 48 to 64: %.3fx (L=%d)"
        % min(fine)[:2])
  project = [(total(L, d), L, d) for L in range(2, 20) for d in WIDTHS]
  print("monotone chain 5e4 -> 8e5 with steps <= 10^0.2 (project head_dim):",
        shortest_chain(project) or "none exists")
  either = set(project) | {(total(L, d, 16), L, d) for L in range(2, 20) for d in FINE_WIDTHS}
  print("monotone chain 5e4 -> 8e5 with steps <= 10^0.2 (head_dim 16 allowed everywhere):",
        shortest_chain(list(either)) or "none exists")


if __name__ == "__main__":
  main()
