"""Key-value retrieval (associative recall) with control over context and position.

An item lists `num_pairs` pairs "k042:v917" with distinct keys, then a query
"? k042"; the target is the value "v917". The queried pair's index is the
`position`, so evaluating a grid of (num_pairs, position) shows whether a model
retrieves from the middle of its context as well as from the ends.
"""

import random


def _digits(num_pairs: int) -> int:
  # Enough key space that distinct keys are easy to draw; values use the same width.
  return max(3, len(str(4 * num_pairs)))


def max_chars(num_pairs: int) -> int:
  """The length of every item's inputs text: the pairs, then " ? k" and the key."""
  width = _digits(num_pairs)
  return num_pairs * (2 * width + 4) - 1 + 4 + width


def item(rng: random.Random, num_pairs: int, position: int | None = None,
         min_pairs: int = 0) -> tuple[str, str]:
  """One (inputs, targets) pair; position None draws it uniformly. With min_pairs > 0 the
  number of pairs is drawn uniformly from [min_pairs, num_pairs] (the key width stays that of
  num_pairs, so items of every size look alike)."""
  if num_pairs < 1:
    raise ValueError(f"num_pairs must be >= 1, got {num_pairs}")
  width = _digits(num_pairs)
  if min_pairs:
    if not 1 <= min_pairs <= num_pairs:
      raise ValueError(f"min_pairs must be in [1, num_pairs={num_pairs}], got {min_pairs}")
    num_pairs = rng.randint(min_pairs, num_pairs)
  if position is None:
    position = rng.randrange(num_pairs)
  if not 0 <= position < num_pairs:
    raise ValueError(f"position must be in [0, {num_pairs}), got {position}")
  keys = rng.sample(range(10**width), num_pairs)
  values = [rng.randrange(10**width) for _ in range(num_pairs)]
  pairs = " ".join(f"k{k:0{width}d}:v{v:0{width}d}" for k, v in zip(keys, values))
  return f"{pairs} ? k{keys[position]:0{width}d}", f"v{values[position]:0{width}d}"


def items(num_pairs: int, position: int, count: int, seed: int = 0) -> list[tuple[str, str]]:
  """`count` items with the query at `position` (0-based), for lost-in-the-middle grids."""
  rng = random.Random(f"kv-eval-{seed}-{num_pairs}-{position}")
  return [item(rng, num_pairs, position) for _ in range(count)]
