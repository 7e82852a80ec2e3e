"""Model shapes for a target size, their parameter counts, and training FLOPs per token.

The shape rule (one knob per choice, so a sweep is reproducible from its sizes alone):
  * MHA with a fixed head_dim; d_ff = ffn_ratio * d_model.
  * depth from the target and the aspect ratio R = d_model / num_layers:
    N ~ 12 L d^2 = 12 R^2 L^3, so L0 = round((N / (12 R^2))^(1/3)), at least 1;
  * for each depth L0-1, L0, L0+1 the two widths d, multiples of head_dim, around
    sqrt(N / (12 L)); of these (up to) six shapes the one whose exact non-embedding count is
    nearest the target in log wins, ties going to the aspect ratio nearest R. Widths come in
    steps of head_dim, a large share of a small model, so the achieved size is within ~12% of
    the target from 1e6 up, ~20% from 1e5, and up to ~40% below that (tests/launch_test.py).
    Sweeps record and fit the achieved counts, never the targets.
Kaplan et al. 2020 (fig. 5) find loss nearly flat in R over 20..200 at fixed N, so R is a
convenience, not a tuned value.

The corrected rule (min_layers=2, min_heads=2, small_head_dim=16, count="total"; see
shape_for_size) is what configs/scaling.py's corrected designs use.

Counting convention (pre-LN decoder, no biases, RMSNorm scales only, tied embeddings):
  non-embedding = L * (attention + feed-forward + 2 d) + d
    attention = d * H * hd (q) + 2 * d * Hkv * hd (k, v) + H * hd * d (o)
    feed-forward = 2 * d * d_ff (GELU family) or 3 * d * d_ff (gated: swiglu, geglu)
  total = non-embedding + V * d (+ V * d again when the output head is untied)
FLOPs per token (training = 3x forward, forward = 2 FLOPs per multiply-add):
  6 * N_non_embedding + 6 * L * T * H * hd,   T = min(seq_len, window)
the convention of transformer/training/throughput.py (which the trainer writes into summary.json) and
transformer/analysis/model_stats.py; tests/launch_test.py checks all three agree. Scores and the weighted
sum each cost 2 T d_attn per token forward, 12 T d_attn for training, halved for the causal
mask (PaLM, appendix B); numerically it equals Kaplan et al.'s 6N + 6 L n_ctx d_attn. The
vocabulary projection is left out with the embeddings. That is the "non_embedding" convention;
the "total" one (Chinchilla, Porian et al. 2024) is 6 * N_total + the same attention term, so
with tied embeddings it adds the output projection's 6 V d (FLOPS_CONVENTIONS; summary.json
`flops_total`). Kept here without jax so sweeps can be planned (and fits run) without loading
the model code.
"""

import math

_FFN_MATRICES = {"relu": 2, "gelu": 2, "gelu_tanh": 2, "swiglu": 3, "geglu": 3}


def _widths(ideal: float, head_dim: int, small_head_dim: int, min_heads: int) -> list[tuple]:
  """(width, head_dim) candidates around `ideal`: multiples of head_dim, and below d_model 64
  (with small_head_dim) multiples of small_head_dim, each with at least min_heads heads."""
  options = set()
  for hd in {head_dim} | ({small_head_dim} if small_head_dim else set()):
    low = max(min_heads, math.floor(ideal / hd))
    for heads in (low - 1, low, low + 1, low + 2):
      width = heads * hd
      if heads < min_heads or (hd == small_head_dim != head_dim and width >= 64):
        continue
      if hd == head_dim and small_head_dim and width < 64:
        continue  # below 64 the small head_dim is the rule
      options.add((width, hd))
  return sorted(options)


def shape_for_size(target: float, *, aspect_ratio: float = 32.0, head_dim: int = 32,
                   ffn_ratio: int = 4, min_layers: int = 1, min_heads: int = 1,
                   small_head_dim: int = 0, count: str = "non_embedding",
                   vocab_size: int = 0, tie_embeddings: bool = True,
                   ffn_fallback: tuple = ()) -> dict:
  """Decoder shape (config.model overrides) whose `count` parameters are near `target`.

  The defaults are the original rule (one layer and one head allowed, head_dim 32
  throughout, sizes as non-embedding counts). The corrected study (configs/scaling.py) uses
  min_layers=2, min_heads=2, small_head_dim=16 (head_dim 16 below d_model 64, so the smallest
  model is d_model 32 with two heads) and count="total" (vocab_size given), and searches
  depths L0-3 .. L0+3 (any shape within 4% of the target
  goes by the aspect ratio) so the achieved size lands within 10% of the target (tested).

  ffn_fallback: d_ff ratios to try, in order, when no shape at ffn_ratio lands within 10% of
  the target; the first that does wins (extended_deep: min_layers=3 leaves no ratio-4 shape
  near 3.5e4 parameters, and ratio 2 has one). A ratio that also misses leaves the ffn_ratio
  shape, so a target the rule cannot meet still gets its nearest shape.
  """
  shape_with = lambda ratio: _shape_for_size(target, aspect_ratio, head_dim, ratio, min_layers,
                                             min_heads, small_head_dim, count, vocab_size,
                                             tie_embeddings)
  shape = shape_with(ffn_ratio)
  miss = lambda s: abs(math.log(param_counts(
      dict(s, vocab_size=vocab_size, ffn="gelu", tie_embeddings=tie_embeddings))[count] / target))
  for ratio in ffn_fallback if miss(shape) > math.log(1.1) else ():
    other = shape_with(ratio)
    if miss(other) <= math.log(1.1):
      return other
  return shape


def _shape_for_size(target, aspect_ratio, head_dim, ffn_ratio, min_layers, min_heads,
                    small_head_dim, count, vocab_size, tie_embeddings) -> dict:
  if not target > 0:
    raise ValueError(f"target size must be positive, got {target}")
  if head_dim < 1 or ffn_ratio < 1 or aspect_ratio <= 0 or min_layers < 1 or min_heads < 1:
    raise ValueError(f"bad shape rule: head_dim={head_dim} ffn_ratio={ffn_ratio} "
                     f"aspect_ratio={aspect_ratio} min_layers={min_layers} min_heads={min_heads}")
  if count not in ("non_embedding", "total"):
    raise ValueError(f"count must be non_embedding or total, got {count!r}")
  original = min_layers == 1 and min_heads == 1 and not small_head_dim
  depth = max(min_layers, round((target / (12 * aspect_ratio ** 2)) ** (1 / 3)))
  spread = 1 if original else 3
  candidates = []
  for layers in range(max(min_layers, depth - spread), depth + spread + 1):
    ideal = math.sqrt(max(target, 1.0) / (12 * layers))
    if original:
      units = ideal / head_dim
      widths = [(h * head_dim, head_dim) for h in {max(1, math.floor(units)),
                                                    max(1, math.ceil(units))}]
    else:
      widths = _widths(ideal, head_dim, small_head_dim, min_heads)
    for width, hd in widths:
      shape = dict(d_model=width, num_layers=layers, num_heads=width // hd, num_kv_heads=0,
                   head_dim=hd, d_ff=ffn_ratio * width)
      n = param_counts(dict(shape, vocab_size=vocab_size, ffn="gelu",
                            tie_embeddings=tie_embeddings))[count]
      miss = abs(math.log(n / target))
      # The corrected rule takes any shape within 4% of the target by aspect ratio, so
      # near-ties in size do not pick a 2-layer, very wide model.
      candidates.append((0.0 if not original and miss < 0.04 else miss,
                         abs(math.log(width / layers / aspect_ratio)), layers, width,
                         shape))
  return min(candidates)[-1]


def _get(model, key, default=None):
  value = model.get(key, default) if hasattr(model, "get") else getattr(model, key, default)
  if value is None:
    raise ValueError(f"model config lacks {key!r}, needed to count parameters")
  return value


# The keys the closed form below assumes at these values (each other value adds parameters:
# a LayerNorm's biases, linear biases, a post-norm block's missing final norm, ...), and the
# position schemes that hold a table.
_COUNTED = {"norm": "rmsnorm", "norm_position": "pre", "use_bias": False, "embed_norm": False,
            "head_bias": False, "num_token_types": 0}
_POSITION_TABLES = ("learned", "t5_bias")


def param_counts(model) -> dict:
  """{'non_embedding', 'total', 'embedding'} for a decoder model config (dict or ConfigDict)."""
  kind = _get(model, "kind", "decoder")
  if kind != "decoder":
    raise ValueError(f"param_counts counts decoders only, got kind={kind!r}")
  outside = {key: _get(model, key, value) for key, value in _COUNTED.items()
              if _get(model, key, value) != value}
  position = model.get("position", {}) if hasattr(model, "get") else {}
  if (position or {}).get("name") in _POSITION_TABLES:
    outside["position.name"] = position["name"]
  if outside:  # the closed form below would silently miss their parameters
    raise ValueError(f"the scaling grid counts parameters of pre-norm RMSNorm decoders without "
                     f"biases or position tables; {outside} is outside that: leave those keys "
                     f"at their defaults for a scaling sweep")
  ffn = _get(model, "ffn", "gelu")
  if ffn not in _FFN_MATRICES:
    raise ValueError(f"unknown ffn {ffn!r}; valid: {sorted(_FFN_MATRICES)}")
  d, layers = _get(model, "d_model"), _get(model, "num_layers")
  heads = _get(model, "num_heads")
  kv_heads = _get(model, "num_kv_heads", 0) or heads
  hd = _get(model, "head_dim", 0) or d // heads
  attention = d * heads * hd + 2 * d * kv_heads * hd + heads * hd * d
  feed_forward = _FFN_MATRICES[ffn] * d * _get(model, "d_ff")
  non_embedding = layers * (attention + feed_forward + 2 * d) + d
  embedding = _get(model, "vocab_size") * d * (1 if _get(model, "tie_embeddings", True) else 2)
  return dict(non_embedding=non_embedding, embedding=embedding, total=non_embedding + embedding)


FLOPS_CONVENTIONS = {
    "non_embedding": "6 * params_non_embedding + 6 * num_layers * seq_len * num_heads * "
                     "head_dim per token (Kaplan et al. 2020; no output projection)",
    "total": "6 * params_total + 6 * num_layers * seq_len * num_heads * head_dim per token "
             "(Chinchilla / Porian et al. 2024: N counts the tied embedding = output "
             "projection, whose matmul costs 6 V d per token)",
}


def flops_per_token(model, seq_len: int, convention: str = "non_embedding") -> int:
  """Training FLOPs per token: 6 N + 6 L n_ctx H hd, N counted as `convention` says
  (FLOPS_CONVENTIONS; see the module docstring)."""
  if convention not in FLOPS_CONVENTIONS:
    raise ValueError(f"unknown FLOPs convention {convention!r}; valid: "
                     f"{sorted(FLOPS_CONVENTIONS)}")
  heads = _get(model, "num_heads")
  hd = _get(model, "head_dim", 0) or _get(model, "d_model") // heads
  window = _get(model, "window", 0)
  context = min(seq_len, window) if window else seq_len
  attention = 6 * _get(model, "num_layers") * context * heads * hd
  return 6 * param_counts(model)[convention] + attention
