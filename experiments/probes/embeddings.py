"""Can a trained run's input embeddings still tell a set of tokens apart?

A language model with tied embeddings never sees some tokens (the grammar corpus has no
digits), and every step pushes all of their output logits down along the same direction, so
their shared input embeddings can end up as one vector: a model started from it cannot tell
those tokens apart, whatever it is trained on next. This prints, per run, the mean pairwise
cosine of the chosen tokens' embeddings (1.0: indistinguishable) and their mean norm, beside
the same for a reference set, and for a fresh initialization of the first run's model.

  python -m experiments.probes.embeddings RUN_DIR [RUN_DIR ...] [--tokens=0123456789]
"""

import jax
import numpy as np
from absl import flags, logging
from flax.linen import meta

from transformer import cli, schema
from transformer.model import models
from transformer.training import checkpoint

FLAGS = flags.FLAGS
flags.DEFINE_string("tokens", "0123456789", "characters whose embeddings to compare")
flags.DEFINE_string("reference", "etaoinshrd", "characters to compare them with")


def similarity(embedding_VD: np.ndarray, ids: list[int]) -> tuple[float, float]:
  """(mean pairwise cosine, mean norm) of the rows `ids` of an embedding table."""
  rows_ND = np.asarray(embedding_VD, np.float64)[ids]
  norms_N = np.linalg.norm(rows_ND, axis=1)
  unit_ND = rows_ND / norms_N[:, None]
  cosine_NN = unit_ND @ unit_ND.T
  return float(cosine_NN[~np.eye(len(ids), dtype=bool)].mean()), float(norms_N.mean())


def _embedding(params: dict) -> np.ndarray:
  flat = schema.flatten(params)
  keys = [k for k in flat if k.endswith("embedder.embedding")]
  if len(keys) != 1:
    raise ValueError(f"expected one embedder.embedding in the parameters, found {keys}")
  return np.asarray(flat[keys[0]])


def _ids(tokenizer, chars: str) -> list[int]:
  ids = [tokenizer.encode(c) for c in chars]
  if any(len(i) != 1 for i in ids):
    raise ValueError(f"every character of {chars!r} must be one token of this tokenizer")
  return [i[0] for i in ids]


def main(argv: list[str]) -> None:
  runs = argv[1:]
  if not runs:
    raise SystemExit("error: give at least one run directory (one with checkpoints/)")
  lines = []  # every run read before the table starts, so a bad one is one line and no table
  for i, run in enumerate(runs):
    _, model_config, params, tokenizer = checkpoint.load_for_inference(run)
    ids, ref = _ids(tokenizer, FLAGS.tokens), _ids(tokenizer, FLAGS.reference)
    rows = [(run, _embedding(params))]
    if i == 0:
      fresh = meta.unbox(models.make_model(model_config).init(
          jax.random.key(0), *models.dummy_inputs(model_config, 1, 8))["params"])
      rows.insert(0, ("fresh initialization of that model", _embedding(fresh)))
    for name, table in rows:
      (c, n), (rc, rn) = similarity(table, ids), similarity(table, ref)
      lines.append(f"| {name} | {c:+.3f} | {n:.3f} | {rc:+.3f} | {rn:.3f} |")
  print(f"| run | {FLAGS.tokens}: mean cosine | norm | {FLAGS.reference}: mean cosine | norm |")
  print("| --- | ---: | ---: | ---: | ---: |")
  print("\n".join(lines))


if __name__ == "__main__":
  cli.run(main, positional=True, verbosity=logging.ERROR)
