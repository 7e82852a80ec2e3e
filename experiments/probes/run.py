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
from absl import flags, logging

from experiments.extrapolation.run import (check_schemes, run_dir_of, scheme_config,
                                           seeds_of, train_schemes)
from experiments import records
from experiments import results as experiment_results
from experiments.probes import criterion, heads, plots
# u_test and wilson are also read as run.u_test / run.wilson (tests).
from experiments.probes.stats import mean_sd, pool_retrieval, pool_seeds
from experiments.probes.stats import u_test, wilson  # noqa: F401
from transformer import cli, data, schema
from transformer.data import grammar
from transformer.training import checkpoint, loop
from transformer.inference.scoring import Scorer

cli.define_train_flags()  # --config / --workdir: the train command's flags
FLAGS = flags.FLAGS
EXPERIMENT = "experiments.probes.run"  # recorded in results.json: who wrote it


def _load(run_dir, step=None):
  _, model_config, params, tokenizer = records.load(run_dir, step)
  return model_config, params, tokenizer


# Bumped when a probe's items, scoring or stored form change, so older cached entries (in
# each run's probes_eval.json, experiments/records.py) are not reused.
PROBE_VERSION = 1


def probe_cached(run_dir: str, summary: dict, probe: str, settings: dict, compute,
                 step: int | None = None):
  """A probe's result on one trained run at `step` (default: its last), computed once (the
  model loaded only then) and read from the run's records afterwards."""
  step = summary.get("step") if step is None else step
  key = {"probe": probe, "settings": settings, "version": PROBE_VERSION,
         "run": records.run_key(summary), "step": step}
  return records.cached(run_dir, key, lambda: compute(*_load(run_dir, step)))


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
  """Exact-match retrieval accuracy by (number of pairs, queried position), each with its
  item count and Wilson interval, and the U-test of every row."""
  out = {}
  for n in (int(x) for x in str(exp.kv_eval_pairs).split(",")):
    positions = sorted(set(np.linspace(0, n - 1, min(n, exp.kv_positions)).round().astype(int)))
    items = data.kv_items(n, 0, 1, seed=exp.seed)
    prompt = items[0][0] + data.PROMPT_SEPARATOR
    length = len(tokenizer.encode(prompt)) + len(tokenizer.encode_continuation(items[0][1])) + 1
    if length > max_len:
      out[n] = {"not_applicable": f"{length} tokens exceed the model's max_len {max_len}",
                "context_tokens": length}
      continue
    row, counts = {}, {}
    for p in positions:
      items = data.kv_items(n, int(p), exp.kv_items, seed=exp.seed)
      _, exact = scorer.continuation_scores(
          tokenizer, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
      row[int(p)] = _proportion(exact)
      counts[int(p)] = (int(exact.sum()), len(exact))
    out[n] = {"accuracy_by_position": row, "context_tokens": length,
              "beyond_training": n > exp.kv_train_pairs,
              "mean_accuracy": float(np.mean([r["accuracy"] for r in row.values()])),
              "u_test": u_test(counts)}
  return out




def main(argv):
  del argv
  run(cli.config(FLAGS["config"]), cli.directory(FLAGS.workdir))


def kv_training_config(config) -> ml_collections.ConfigDict:
  """The retrieval models' training config: kv_retrieval items of kv_min_pairs to
  kv_train_pairs pairs (one item per row segment), kv_seq_len tokens per row, and the kv_*
  knobs; experiment.kv_overrides.<scheme> holds each scheme's own settings (lr, steps)."""
  exp = config.experiment
  kv_config = ml_collections.ConfigDict(config.to_dict())
  kv_config.data.name = "kv_retrieval"
  kv_config.data.num_pairs = exp.kv_train_pairs
  kv_config.data.min_pairs = exp.kv_min_pairs
  kv_config.data.cross_document = False
  kv_config.data.seq_len = exp.kv_seq_len
  kv_config.experiment.eval_multipliers = str(max(1, exp.kv_max_len // exp.kv_seq_len))
  kv_config.experiment.seeds = exp.kv_seeds
  kv_config.experiment.overrides = exp.kv_overrides
  kv_config.train.steps = exp.kv_steps
  kv_config.train.batch_size = exp.kv_batch_size
  kv_config.opt.lr = exp.kv_lr
  kv_config.opt.warmup_steps = exp.kv_warmup_steps
  kv_config.opt.schedule = exp.kv_schedule
  return kv_config


def pretrained_variant(lm_config, kv_config, scheme: str) -> dict:
  """The LM-pretrained retrieval run's differences from the scheme's retrieval run: it
  starts from the LM run of the same scheme and seed (train.init_from), so it is that LM's
  model (its max_len: the LM's evaluation lengths). Any other model key that differs is a
  one-line error here, before anything trains."""
  lm_model = scheme_config(lm_config, scheme).model
  kv_model = criterion.attempt_config(kv_config, scheme, 0, "", 1,
                                      max_len=lm_model.max_len).model
  if lm_model.max_len < kv_config.data.seq_len:
    raise ValueError(f"experiment.kv_pretrained_schemes: {scheme}'s language model positions "
                     f"{lm_model.max_len} tokens, fewer than the retrieval rows' "
                     f"{kv_config.data.seq_len} (kv_seq_len); leave {scheme} out")
  lm_flat, kv_flat = (schema.flatten(m.to_dict()) for m in (lm_model, kv_model))
  differing = [k for k in sorted(set(lm_flat) | set(kv_flat))
               if k not in schema.RUNTIME_KEYS and lm_flat.get(k) != kv_flat.get(k)]
  if differing:
    raise ValueError(f"experiment.kv_pretrained_schemes: {scheme}'s retrieval model differs "
                     f"from its language model in " + ", ".join(
                         f"model.{k} ({lm_flat.get(k)!r} vs {kv_flat.get(k)!r})"
                         for k in differing[:4])
                     + "; set experiment.kv_overrides so the models match")
  return {"max_len": lm_model.max_len}


def run(config, workdir: str) -> None:
  loop.configure_host(**cli.host_settings())
  logging.set_verbosity(logging.ERROR)
  start = time.time()
  exp = config.experiment
  schemes = [s for s in str(exp.schemes).split(",") if s]
  kv_config = kv_training_config(config)
  kv_dir = os.path.join(workdir, "kv")
  kv_lm_dir = os.path.join(workdir, "kv_lm")
  kv_schemes = [s for s in str(exp.kv_schemes).split(",") if s]
  pt_schemes = [s for s in str(exp.kv_pretrained_schemes).split(",") if s]
  # Every set of schemes, the criterion's settings and the workdir are checked before
  # anything trains.
  lm_dir = exp.lm_workdir or os.path.join(workdir, "lm")
  if exp.lm_workdir and not os.path.isdir(exp.lm_workdir):
    # A mistyped path would otherwise start every language model training in it.
    raise ValueError(f"experiment.lm_workdir={exp.lm_workdir} is not a directory: give the "
                     f"extrapolation experiment's --workdir (or leave it empty to train the "
                     f"language models in {os.path.join(workdir, 'lm')})")
  lm_config = ml_collections.ConfigDict(config.to_dict())
  check_schemes(lm_config, schemes)
  if kv_schemes:  # none: the language models' probes alone (run_all.sh, one run at a time)
    check_schemes(kv_config, kv_schemes, "experiment.kv_schemes")
  criterion.check_settings(exp)
  if pt_schemes:
    check_schemes(kv_config, pt_schemes, "experiment.kv_pretrained_schemes")
  missing = [s for s in pt_schemes if s not in schemes]
  if missing:
    raise ValueError(f"experiment.kv_pretrained_schemes: {missing} have no language model "
                     f"(experiment.schemes={exp.schemes!r}); add them there or leave them out")
  variants = {s: pretrained_variant(lm_config, kv_config, s) for s in pt_schemes}
  kv_seeds = seeds_of(kv_config)
  # The census reads those of these seeds this invocation trains (run_all.sh probes one seed
  # at a time).
  census_seeds = seeds_of(config, "census_seeds")
  missing = [k for k in kv_seeds if pt_schemes and k not in seeds_of(lm_config)]
  if missing:
    raise ValueError(f"experiment.kv_seeds: seeds {missing} have no language model to start "
                     f"the LM-pretrained retrieval runs from (experiment.seeds={exp.seeds!r})")
  lm_run = lambda scheme: lambda seed: run_dir_of(lm_dir, scheme, seed)
  for scheme in kv_schemes:
    criterion.check_finished(kv_config, kv_dir, scheme, kv_seeds)
  for scheme in pt_schemes:
    criterion.check_finished(kv_config, kv_lm_dir, scheme, kv_seeds, lm_run(scheme),
                             variants[scheme]["max_len"])
  # An extrapolation workdir given as --workdir (say, the same as lm_workdir) would have its
  # results.json and results.md overwritten by the probes'.
  experiment_results.check_workdir(workdir, EXPERIMENT)
  os.makedirs(workdir, exist_ok=True)

  lm_runs = train_schemes(lm_config, lm_dir, schemes)
  kv_runs = {s: criterion.train_to_criterion(kv_config, kv_dir, s, kv_seeds)
             for s in kv_schemes}
  pt_runs = {s: criterion.train_to_criterion(kv_config, kv_lm_dir, s, kv_seeds,
                                             f"{s} (LM-pretrained)", lm_run(s),
                                             variants[s]["max_len"]) for s in pt_schemes}

  results = {"dataset": lm_config.data.name,  # replication.py compares only like with like
             "agreement": {}, "census": {}, "retrieval": {}, "retrieval_criterion": {},
             "retrieval_lm_pretrained": {}, "retrieval_criterion_lm_pretrained": {},
             "kv_train_pairs": exp.kv_train_pairs, "kv_min_pairs": exp.kv_min_pairs,
             "kv_criterion": exp.kv_criterion, "kv_check_items": exp.kv_check_items,
             "kv_stages": criterion.stages(exp), "kv_retry": exp.kv_retry.to_dict(),
             "kv_pretrained_retry": {k: v for k, v in
                                     exp.get("kv_pretrained_retry", {}).items() if v is not None},
             "kv_warm_steps": exp.kv_warm_steps, "kv_warm_pairs": exp.kv_warm_pairs,
             "lm_then_retrieval": LM_THEN_RETRIEVAL.format(
                 schemes=", ".join(pt_schemes) or "none", lm_dir=lm_dir),
             "agreement_scoring": "complete words, boundaries " + repr(WORD_BOUNDARIES)}
  agreement_settings = {"items": exp.agreement_items, "seed": exp.seed,
                        "boundaries": list(WORD_BOUNDARIES)}
  census_settings = {"items": exp.census_items, "seed": exp.seed}
  for scheme in schemes:
    for seed, summary in lm_runs[scheme].items():
      print(f"== probing {scheme} seed {seed}", flush=True)
      run_dir = run_dir_of(lm_dir, scheme, seed)
      results["agreement"].setdefault(scheme, {})[seed] = probe_cached(
          run_dir, summary, "agreement", agreement_settings,
          lambda cfg, params, tokenizer: agreement(Scorer(cfg, params), tokenizer, exp))
      if seed in census_seeds:
        results["census"].setdefault(scheme, {})[seed] = probe_cached(
            run_dir, summary, "census", census_settings,
            lambda cfg, params, tokenizer: heads.census_summary(cfg, params, tokenizer, exp))
  results["agreement_pooled"] = {s: pool_seeds(r) for s, r in results["agreement"].items()}
  results["agreement_distance_control"] = {s: distance_control(r)
                                           for s, r in results["agreement"].items()}
  for runs, key, suffix in ((kv_runs, "retrieval", ""),
                            (pt_runs, "retrieval_lm_pretrained", " (LM-pretrained)")):
    for scheme, by_seed in runs.items():
      for seed, record in by_seed.items():
        crit = results[key.replace("retrieval", "retrieval_criterion")]
        crit.setdefault(scheme, {})[seed] = record
        if "run_dir" not in record:  # never trained (no setting met it on the first seed)
          continue
        print(f"== retrieval {scheme}{suffix} seed {seed}", flush=True)
        settings = {k: exp[k] for k in ("kv_eval_pairs", "kv_positions", "kv_items", "seed",
                                        "kv_train_pairs")}
        r = probe_cached(record["run_dir"], criterion.read_summary(record["run_dir"]),
                         "retrieval", settings,
                         lambda cfg, params, tokenizer: retrieval(Scorer(cfg, params), tokenizer,
                                                                  exp, cfg.max_len),
                         step=record["step"])
        r = {int(n): row for n, row in r.items()}
        results[key].setdefault(scheme, {})[seed] = r
        record["accuracy_at_training_pairs"] = r.get(exp.kv_train_pairs, {}).get(
            "mean_accuracy")
  for key in ("retrieval", "retrieval_lm_pretrained"):
    results[f"{key}_pooled"] = {s: pool_retrieval(r) for s, r in results[key].items()}
  # Schemes compared in the lost-in-the-middle results: those whose every seed met the
  # criterion; the others are training failures.
  results["retrieval_compared"] = {
      key: sorted(s for s, by_seed in results[f"retrieval_criterion{key}"].items()
                  if all(r["met"] for r in by_seed.values()))
      for key in ("", "_lm_pretrained")}

  # The maps of map_scheme's first census seed, when this invocation has that run (a
  # run_all.sh step that probes one scheme and seed at a time skips them).
  scheme, map_seed = exp.map_scheme, census_seeds[0]
  if map_seed in lm_runs.get(scheme, {}):
    maps = probe_cached(run_dir_of(lm_dir, scheme, map_seed),
                        lm_runs[scheme][map_seed], "attention_maps",
                        {"sentence": exp.map_sentence},
                        lambda cfg, params, tokenizer: heads.maps(cfg, params, tokenizer,
                                                                  exp.map_sentence))
    results["attention_maps"] = heads.plot_maps(maps, workdir) | {"scheme": scheme,
                                                                  "seed": map_seed}
  experiment_results.write(results, workdir, start, plots.write_all, EXPERIMENT)


# Liu et al. 2023 probed pretrained language models. The closer variant here: a decoder
# trained as a language model on the corpus, then on retrieval (train.init_from), with the
# same criterion, curve and U-test.
LM_THEN_RETRIEVAL = ("the language model of the same scheme and seed ({lm_dir}/runs/<scheme>/"
                     "seed<k>), then trained on retrieval from its parameters (fresh "
                     "optimizer) to the same criterion; schemes: {schemes}")



def distance_control(by_seed: dict) -> dict:
  """The control for attraction: the same distance (3 words) with an attractor and without.

  agreement_probes puts a same-number noun after the head with probability 1/2, so distance 0
  holds exactly the 0-attractor items without it, and distance 3 the 0-attractor items with it
  plus the 1-attractor items without one (tests/probes_test.py checks this). The cells are
  therefore exact differences of the recorded counts, pooled over seeds, each with its Wilson
  interval, and each seed's accuracy with their mean +- sd over seeds; "attractor_cost" is
  each seed's d3_k0 - d3_k1 over seeds (the seed as the unit: a paired comparison):
  {"d0_k0", "d3_k0", "d3_k1"} -> {accuracy, n, wilson95, over_seeds: {mean, sd, t95, seeds}},
  "attractor_cost" -> {mean, sd, t95, seeds, positive_seeds}."""
  count = lambda c: (round(c["accuracy"] * c["n"]), c["n"]) if c else (0, 0)
  cell = lambda r: lambda key, k: count((r.get(key) or {}).get(str(k), (r.get(key) or {}).get(k)))
  tot = {"d0_k0": [0, 0], "d3_k0": [0, 0], "d3_k1": [0, 0]}
  per_seed, costs = {key: [] for key in tot}, []
  for r in by_seed.values():
    get = cell(r)
    (a0, n0), (d0, nd0), (d3, nd3) = get("by_attractors", 0), get("by_distance", 0), \
        get("by_distance", 3)
    seed = {}
    for key, (right, n) in (("d0_k0", (d0, nd0)), ("d3_k0", (a0 - d0, n0 - nd0)),
                            ("d3_k1", (d3 - (a0 - d0), nd3 - (n0 - nd0)))):
      tot[key][0] += right
      tot[key][1] += n
      if n:
        per_seed[key].append(right / n)
        seed[key] = right / n
    if "d3_k0" in seed and "d3_k1" in seed:
      costs.append(seed["d3_k0"] - seed["d3_k1"])
  out = {key: {"accuracy": right / n, "n": n, "wilson95": wilson(right, n),
               "over_seeds": {**mean_sd(per_seed[key]), "seeds": len(per_seed[key])}}
         for key, (right, n) in tot.items() if n}
  if costs:
    out["attractor_cost"] = {**mean_sd(costs), "seeds": len(costs),
                             "positive_seeds": sum(c > 0 for c in costs)}
  return out


if __name__ == "__main__":
  cli.run(main, required=("config", "workdir"), verbosity=logging.ERROR)
