"""Attention weights per layer and head, and heatmaps of them for a tokenized sentence.

Weights are read from the 'intermediates' collection every Attention module sows into when it
is mutable, so no hooks or model changes are needed:

  weights = capture(model, variables, tokens_BL)           # {layer_name: [B, N, L, S]}
  plot_heads(weights["tower/layers_1/self_attention"][0], labels, "heads.png")
"""

import functools
import math

import jax
import ml_collections
import numpy as np

from transformer.model import models


@functools.partial(jax.jit, static_argnums=0)
def _intermediates(model, params, *inputs):
  return model.apply({"params": params}, *inputs, mutable=["intermediates"])[1]["intermediates"]


def capture(model, variables, *inputs) -> dict[str, np.ndarray]:
  """Run the model once and return every attention layer's weights, keyed by module path.

  Compiled once per input shape (on a frozen copy of the model's config, which keys the
  program): run op by op, every new sentence length compiled each of the model's operations
  again, several times slower over a probe set of many lengths. Scanned stacks hold all
  layers in one array; they are split into "layers_i" entries."""
  model = models.make_model(ml_collections.FrozenConfigDict(model.cfg))
  intermediates = _intermediates(model, variables["params"], *inputs)
  out = {}
  flat = jax.tree_util.tree_flatten_with_path(intermediates)[0]
  for path, value in flat:
    names = [getattr(k, "key", str(k)) for k in path]
    if "attention_weights" not in names:
      continue
    name = "/".join(n for n in names if n not in ("attention_weights", "stack") and
                    not n.startswith("["))
    value = np.asarray(value)
    if "layers" in names and value.ndim == 5:  # scanned: [layers, B, N, L, S]
      for i, layer in enumerate(value):
        out[name.replace("layers", f"layers_{i}")] = layer
    else:
      out[name] = value
  return out


def plot_heads(weights_NLS: np.ndarray, query_labels, path: str, key_labels=None,
               title: str = "") -> str:
  """One heatmap per head (rows: queries, columns: keys), token labels on both axes."""
  # Imported here: matplotlib is the `experiments` extra, which the core install goes without.
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("plotting needs matplotlib: pip install -e '.[experiments]'") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  key_labels = query_labels if key_labels is None else key_labels
  n = weights_NLS.shape[0]
  cols = min(n, 4)
  rows = math.ceil(n / cols)
  size = 0.28 * max(len(query_labels), len(key_labels)) + 1.5
  fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size), squeeze=False,
                           layout="constrained")
  for h in range(rows * cols):
    ax = axes[h // cols][h % cols]
    if h >= n:
      ax.axis("off")
      continue
    image = ax.imshow(weights_NLS[h], cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_title(f"head {h}", fontsize=9)
    ax.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(query_labels)), query_labels, fontsize=7)
    ax.set_xlabel("key (attended-to token)", fontsize=7)
    ax.set_ylabel("query token", fontsize=7)
  fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
  if title:
    fig.suptitle(title)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path
