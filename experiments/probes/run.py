r"""Probes of trained decoders: agreement with attractors, lost in the middle, attention maps.

  python -m experiments.probes.run --config configs/probes.py --workdir DIR

"Move the relevant fact, add plausible distractions, and check whether the answer stays
correct" (first seed):
  * agreement: does the model prefer "The keys to the cabinet ... are" over "... is", by
    number of attractors (0..4) and by subject-verb distance, per positional scheme;
  * lost in the middle: key-value retrieval with the queried pair at position p of n pairs,
    for n below, at and beyond the training context, per scheme;
  * attention maps: every head of a layer for one sentence, and a summary of notable heads
    (previous-token, attention sink on the first token, verb-to-subject) measured over many
    probe sentences.
Language models are reused from an extrapolation run (experiment.lm_workdir) or trained here;
everything is resumable like the extrapolation experiment.
"""

import functools
import os
import time

import ml_collections
import numpy as np
from absl import app, flags, logging

from experiments.extrapolation.run import check_schemes, train_schemes
from experiments import results as experiment_results
from experiments.probes import heads, plots
from transformer import checkpoint, cli, data, train
from transformer.data import grammar
from transformer.scoring import Scorer

FLAGS = flags.FLAGS  # --config / --workdir: transformer.train's flags
EXPERIMENT = "experiments.probes.run"  # recorded in results.json: who wrote it


def _load(run_dir):
  _, model_config, params, tokenizer = checkpoint.load_for_inference(run_dir)
  return model_config, params, tokenizer


# What the grammar can produce right after a verb: " " before the next word (an adjective
# after a copula, a noun phrase after "has"/"have" or a transitive verb, an adverb after an
# intransitive one) or "." when an intransitive verb ends the sentence. No word continues
# into letters, so the probability of a verb as a complete word is the sum over these two.
WORD_BOUNDARIES = (" ", ".")


def word_logprobs(scorer, tokenizer, prefixes, words, boundaries=WORD_BOUNDARIES):
  """log P(" " + word as a complete word | prefix): log-sum-exp over the boundaries that may
  follow it. With boundaries=("",) it is the pre-fix scoring, which compares " sleep" with
  " sleeps" although " sleep" is a prefix of " sleeps" (so it never loses to it)."""
  per_boundary = [scorer.continuation_scores(tokenizer, prefixes,
                                             [" " + w + b for w in words])[0]
                  for b in boundaries]
  return np.logaddexp.reduce(np.stack(per_boundary), axis=0)


def agreement_correct(scorer, tokenizer, items, boundaries=WORD_BOUNDARIES) -> np.ndarray:
  """Per item: does the agreeing verb, as a complete word, beat the other form? Ties
  (a model indifferent between them) count as wrong."""
  prefixes = [it.prefix for it in items]
  good = word_logprobs(scorer, tokenizer, prefixes, [it.correct for it in items], boundaries)
  bad = word_logprobs(scorer, tokenizer, prefixes, [it.wrong for it in items], boundaries)
  return good > bad


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
  """Wilson score interval of a binomial proportion (95% by default)."""
  if n == 0:
    return [float("nan"), float("nan")]
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return [float(centre - half), float(centre + half)]


def _proportion(values) -> dict:
  values = [bool(v) for v in values]
  return {"accuracy": float(np.mean(values)) if values else None, "n": len(values),
          "wilson95": wilson(sum(values), len(values))}


def agreement(scorer, tokenizer, exp, max_len: int | None = None) -> dict:
  """Accuracy of preferring the agreeing verb (complete words), by attractors, by distance
  and by verb kind, each with its item count and Wilson interval. Items longer than the
  model can position (a learned table) are left out and counted."""
  max_len = scorer.config.max_len if max_len is None else max_len
  fits = lambda it: 2 + len(tokenizer.encode(f"{it.prefix} {it.correct} {it.wrong}.")) <= max_len
  by_attractors, by_distance, by_kind, by_head, evaluated = {}, {}, {}, {}, {}
  for k in range(5):
    items = [it for it in data.agreement_probes(exp.agreement_items, k, seed=exp.seed)
             if fits(it)]
    evaluated[k] = len(items)
    if not items:
      by_attractors[k] = None
      continue
    right = agreement_correct(scorer, tokenizer, items)
    by_attractors[k] = _proportion(right)
    for it, r in zip(items, right):
      by_distance.setdefault(it.distance, []).append(r)
      by_kind.setdefault(verb_kind(it), []).append(r)
      by_head.setdefault(head_number(it), []).append(r)
  return {"by_attractors": by_attractors,
          "by_distance": {d: _proportion(v) for d, v in sorted(by_distance.items())},
          "by_verb_kind": {k: _proportion(v) for k, v in sorted(by_kind.items())},
          "by_head_number": {k: _proportion(v) for k, v in sorted(by_head.items())},
          "items_evaluated": evaluated,
          "scoring": "complete words: log-sum-exp over the boundaries " + repr(WORD_BOUNDARIES)}


@functools.cache
def _verb_kinds() -> dict:
  """(singular form, plural form) -> the verb's kind in the grammar."""
  lex = grammar.lexicon()
  kinds = {("is", "are"): "copula", ("was", "were"): "copula", ("has", "have"): "has/have"}
  kinds.update({pair: "transitive" for pair in lex.verbs_t})
  kinds.update({pair: "intransitive" for pair in lex.verbs_i})
  return kinds


def head_number(item) -> str:
  return "sg" if (item.correct, item.wrong) in _verb_kinds() else "pl"


def verb_kind(item) -> str:
  """copula, has/have, transitive or intransitive, marked when one form is a prefix of the
  other (the items the pre-fix scoring could not get right for singular heads)."""
  pair = (item.correct, item.wrong)
  kind = _verb_kinds().get(pair) or _verb_kinds()[pair[::-1]]
  prefix = item.correct.startswith(item.wrong) or item.wrong.startswith(item.correct)
  return kind + (" (prefix forms)" if prefix else "")


def retrieval(scorer, tokenizer, exp, max_len: int) -> dict:
  """Exact-match retrieval accuracy by (number of pairs, queried position)."""
  out = {}
  for n in (int(x) for x in str(exp.kv_eval_pairs).split(",")):
    positions = sorted(set(np.linspace(0, n - 1, min(n, exp.kv_positions)).round().astype(int)))
    items = data.kv_items(n, 0, 1, seed=exp.seed)
    prompt = items[0][0] + data.PROMPT_SEPARATOR
    length = len(tokenizer.encode(prompt)) + len(tokenizer.encode(items[0][1])) + 1
    if length > max_len:
      out[n] = {"not_applicable": f"{length} tokens exceed the model's max_len {max_len}"}
      continue
    row = {}
    for p in positions:
      items = data.kv_items(n, int(p), exp.kv_items, seed=exp.seed)
      _, exact = scorer.continuation_scores(
          tokenizer, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
      row[int(p)] = float(exact.mean())
    out[n] = {"accuracy_by_position": row, "context_tokens": length}
  return out


def u_shape(row: dict) -> dict:
  """Is accuracy at both ends higher than in the middle (the lost-in-the-middle shape)?"""
  positions = sorted(row, key=int)
  acc = np.array([row[p] for p in positions])
  third = max(1, len(acc) // 3)
  ends = min(acc[:third].mean(), acc[-third:].mean())
  middle = acc[third:-third].mean() if len(acc) > 2 * third else np.nan
  return {"ends": float(ends), "middle": float(middle),
          "u_shaped": bool(ends > middle + 0.05) if np.isfinite(middle) else None}


def main(argv):
  del argv
  config, workdir = cli.config(FLAGS["config"]), FLAGS.workdir
  if config is None or not workdir:
    raise app.UsageError("--config and --workdir are required")
  try:
    run(config, workdir)
  except (ValueError, FileNotFoundError) as e:
    # Config and data mistakes are the user's to fix: one line, as transformer.train says them.
    raise SystemExit(f"error: {e}") from None


def run(config, workdir: str) -> None:
  train.configure_host()
  logging.set_verbosity(logging.ERROR)
  start = time.time()
  exp = config.experiment
  schemes = [s for s in str(exp.schemes).split(",") if s]
  kv_config = ml_collections.ConfigDict(config.to_dict())
  kv_config.data.name = "kv_retrieval"
  kv_config.data.num_pairs = exp.kv_train_pairs
  kv_config.data.cross_document = False
  kv_config.data.seq_len = exp.kv_seq_len
  kv_config.experiment.eval_multipliers = str(exp.kv_max_len // exp.kv_seq_len)
  kv_config.train.steps = exp.kv_steps
  kv_config.opt.lr = exp.kv_lr
  kv_dir = os.path.join(workdir, "kv")
  kv_schemes = [s for s in str(exp.kv_schemes).split(",") if s]
  # Both sets of schemes and the workdir are checked before anything trains.
  lm_dir = exp.lm_workdir or os.path.join(workdir, "lm")
  lm_config = ml_collections.ConfigDict(config.to_dict())
  check_schemes(lm_config, schemes)
  check_schemes(kv_config, kv_schemes, "experiment.kv_schemes")
  # An extrapolation workdir given as --workdir (say, the same as lm_workdir) would have its
  # results.json and results.md overwritten by the probes'.
  experiment_results.check_workdir(workdir, EXPERIMENT)
  os.makedirs(workdir, exist_ok=True)

  train_schemes(lm_config, lm_dir, schemes)
  train_schemes(kv_config, kv_dir, kv_schemes)

  results = {"agreement": {}, "retrieval": {}, "retrieval_shape": {},
             "kv_train_pairs": exp.kv_train_pairs}
  for scheme in schemes:
    print(f"== probing {scheme}", flush=True)
    cfg, params, tokenizer = _load(os.path.join(lm_dir, "runs", scheme))
    results["agreement"][scheme] = agreement(Scorer(cfg, params), tokenizer, exp)
    if scheme not in kv_schemes:
      continue
    cfg, params, tokenizer = _load(os.path.join(kv_dir, "runs", scheme))
    results["retrieval"][scheme] = retrieval(Scorer(cfg, params), tokenizer, exp, cfg.max_len)
    results["retrieval_shape"][scheme] = {
        n: u_shape(r["accuracy_by_position"]) for n, r in results["retrieval"][scheme].items()
        if "accuracy_by_position" in r}

  scheme = exp.map_scheme if exp.map_scheme in schemes else schemes[0]
  cfg, params, tokenizer = _load(os.path.join(lm_dir, "runs", scheme))
  results["attention_maps"] = heads.maps_and_summary(
      cfg, params, tokenizer, exp.map_sentence, exp.map_layer, workdir, exp)
  results["attention_maps"]["scheme"] = scheme
  experiment_results.write(results, workdir, start, plots.write_all, EXPERIMENT)

if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
