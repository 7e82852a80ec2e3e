"""Retrieval models trained to a stated criterion (lost in the middle, issue 19).

Every retrieval model trains in stages: kv_steps, then kv_extend_steps more at a time up to
kv_max_steps (the cap). After each stage a held-out check, kv_check_items items of
kv_train_pairs pairs (the training context length) with the query at a uniformly drawn
position, from a random stream the training set and the evaluation grid never use, decides:
exact-match accuracy >= kv_criterion stops training there. A run that reaches the cap below it
is retried once per entry of experiment.kv_retry.<scheme> ("opt.lr=3e-4;opt.warmup_steps=500",
entries separated by "|"), each a new run on the first seed; the other seeds train with the
settings that met the criterion, and not at all when none did. Settings that another seed
then falls short with are not the scheme's: the search goes on with the next entry, every
seed again (train_to_criterion). A retry entry may raise its
own cap with "kv_max_steps=N" (tuning the steps, as issue 19 asks of RoPE) and its own
warm-up runs with "kv_warm_pairs=4,8,16" (below); the other entries are config overrides. A
scheme that never meets it is a training failure: reported, never compared.

With kv_warm_steps > 0 every attempt first trains a warm-up run, kv_warm_steps on items of
exactly kv_warm_pairs pairs with the attempt's settings, in "<attempt dir>_warm", and its
stages start from those parameters (train.init_from; fresh optimizer and schedule). Several
comma-separated counts make a curriculum: one warm-up run per count, each kv_warm_steps long
and starting from the one before ("_warm", "_warm2", ...). Trained on 2-32 pairs from the
start every model stayed at chance for 2000 steps; ALiBi learns 4-pair items in 1000 and
carries the lookup to 2-32 pairs (experiments/probes/README.md). Items restart their
positions, so a model warmed up on 4 pairs has seen positions up to ~60 only: the sinusoidal
one that got 4-pair items right (0.99) got none of 8, 16 or 32 pairs right, and the absolute
schemes then stayed below the criterion on 2-32 pairs. The
LM-pretrained variant's warm-up starts from the language model. "steps_to_criterion" counts
the stages only; each attempt's record says what came before it ("warm").

The schedule of the retrieval models is rsqrt (configs/probes.py), which does not depend on
train.steps, so a run resumed with more steps trains exactly as one given those steps from
the start would have, and "steps to criterion" means what it says.

Resumable: each stage's check is cached in the run directory (criterion.json, keyed by the
check's settings and the trained run); a re-run skips checked stages and trains on from the
latest checkpoint. A finished stage trained with other settings is refused before anything
trains (as in experiments.extrapolation.run).
"""

import json
import os
import random
import sys

import ml_collections
import numpy as np

from experiments.extrapolation.run import (check_finished_run, parse_overrides, run_dir_of,
                                           scheme_config)
from experiments import records
from experiments.probes.stats import wilson
from transformer import data
from transformer.data import kv_retrieval
from transformer.inference.scoring import Scorer
from transformer.training import loop

CHECK_VERSION = 1  # bumped when the check's items or scoring change


def check_items(num_pairs: int, count: int, seed: int = 0) -> list[tuple[str, str]]:
  """Held-out items for the criterion: uniformly drawn query positions, from an RNG stream of
  their own (training items come from "kv/<split>/<i>", the evaluation grid from
  "kv-eval-...")."""
  rng = random.Random(f"kv-criterion-{seed}-{num_pairs}")
  return [kv_retrieval.item(rng, num_pairs) for _ in range(count)]


def check_accuracy(run_dir: str, step: int, exp) -> dict:
  """Exact-match accuracy of the run's step-`step` parameters on the check items."""
  _, model_config, params, tokenizer = records.load(run_dir, step)
  items = check_items(exp.kv_train_pairs, exp.kv_check_items, exp.seed)
  _, exact = Scorer(model_config, params).continuation_scores(
      tokenizer, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
  right = int(np.sum(exact))
  return {"step": step, "accuracy": right / len(items), "n": len(items),
          "wilson95": wilson(right, len(items))}


# In a retry entry, that attempt's own cap and warm-up stages, not config overrides.
CAP_KEY, WARM_KEY = "kv_max_steps", "kv_warm_pairs"


def _counts(value, what: str) -> tuple[int, ...]:
  """"4,8,16" (or 4) -> (4, 8, 16): whole numbers >= 1."""
  parts = [p.strip() for p in str(value).split(",")]
  if not all(p.isdigit() and int(p) >= 1 for p in parts):
    raise ValueError(f"{what}={value!r}: whole numbers >= 1, separated by commas")
  return tuple(int(p) for p in parts)


def split_retry(retry: str) -> tuple[str, int | None, tuple[int, ...] | None]:
  """"opt.lr=3e-4;kv_max_steps=3000;kv_warm_pairs=4,8" -> ("opt.lr=3e-4", 3000, (4, 8)): an
  attempt's config overrides, its own cap and its own warm-up pairs (None: the experiment's)."""
  parts = [p.strip() for p in str(retry or "").split(";") if p.strip()]
  own = {}
  for p in parts:
    key, _, value = p.partition("=")
    if key.strip() in (CAP_KEY, WARM_KEY):
      own[key.strip()] = _counts(value.strip(), f"{key.strip()} in a kv_retry entry")
  if len(own.get(CAP_KEY, ())) > 1:
    raise ValueError(f"{CAP_KEY} in a kv_retry entry: one whole number of steps >= 1")
  rest = ";".join(p for p in parts if p.partition("=")[0].strip() not in own)
  return rest, own.get(CAP_KEY, (None,))[0], own.get(WARM_KEY)


def warm_pairs(exp, retry: str = "") -> tuple[int, ...]:
  """The pairs of each warm-up run of an attempt, in order; none when kv_warm_steps is 0."""
  if not int(exp.get("kv_warm_steps", 0)):
    return ()
  own = split_retry(retry)[2]
  if own is not None:
    return own
  return _counts(exp.get("kv_warm_pairs", 0), "experiment.kv_warm_pairs")


def stages(exp, cap: int | None = None) -> list[int]:
  """The step counts after which the criterion is checked: kv_steps, + kv_extend_steps, ...,
  and the cap (kv_max_steps, or an attempt's own) last."""
  first, extend = int(exp.kv_steps), int(exp.kv_extend_steps)
  cap = int(exp.kv_max_steps) if cap is None else int(cap)
  if first < 1 or cap < first or (extend < 1 and cap > first):
    raise ValueError(f"experiment.kv_steps={first}, kv_extend_steps={extend}, kv_max_steps="
                     f"{cap}: need 1 <= kv_steps <= kv_max_steps and kv_extend_steps >= 1 "
                     f"when kv_max_steps > kv_steps")
  out = list(range(first, cap, extend)) if cap > first else []
  return out + [cap]


def check_settings(exp) -> None:
  """The criterion's settings, before anything trains."""
  stages(exp)
  if not 0 <= float(exp.kv_criterion) <= 1:
    raise ValueError(f"experiment.kv_criterion={exp.kv_criterion}: an accuracy in [0, 1]")
  if int(exp.kv_check_items) < 1:
    raise ValueError(f"experiment.kv_check_items={exp.kv_check_items}: need >= 1 (the "
                     f"criterion is stated for >= 500)")
  warm_steps = int(exp.get("kv_warm_steps", 0))
  if warm_steps < 0:
    raise ValueError(f"experiment.kv_warm_steps={warm_steps}: need >= 0 (0: no warm-up)")
  _check_warm_pairs(exp, warm_pairs(exp), "experiment.kv_warm_pairs")


def _check_warm_pairs(exp, pairs, what: str) -> None:
  if any(p > int(exp.kv_train_pairs) for p in pairs):
    raise ValueError(f"{what}={','.join(map(str, pairs))}: each at most "
                     f"kv_train_pairs={exp.kv_train_pairs}")


def attempts(config, scheme: str, pretrained: bool = False) -> list[str]:
  """The settings tried in order: the scheme's own (""), then its kv_retry entries; for the
  LM-pretrained variant, its kv_pretrained_retry entry where one is set (a variant whose
  attempts stopped earlier than the from-scratch runs' keeps its own list; "" is none)."""
  key, table = "kv_retry", config.experiment.get("kv_retry")
  own = config.experiment.get("kv_pretrained_retry") if pretrained else None
  if own is not None and own.get(scheme) is not None:
    key, table = "kv_pretrained_retry", own
  text = (table.get(scheme, "") if table is not None else "") or ""
  retries = [t.strip() for t in str(text).split("|") if t.strip()]
  for r in retries:  # a typo fails before training
    overrides, cap, _ = split_retry(r)
    parse_overrides(overrides, f"experiment.{key}.{scheme}")
    stages(config.experiment, cap)
    _check_warm_pairs(config.experiment, warm_pairs(config.experiment, r),
                      f"{WARM_KEY} in experiment.{key}.{scheme}")
  return [""] + retries


def attempt_config(config, scheme: str, seed: int, retry: str, steps: int,
                   init_from: str = "", max_len: int | None = None):
  """One attempt's training config at `steps` steps: the scheme's config (kv_overrides) with
  the retry's settings over it; for the LM-pretrained variant, init_from and the LM's
  max_len (the parameters restore only into the same model)."""
  cfg = ml_collections.ConfigDict(config.to_dict())
  own = cfg.experiment.overrides.get(scheme, "") or ""
  cfg.experiment.overrides[scheme] = ";".join(x for x in (own, split_retry(retry)[0]) if x)
  out = scheme_config(cfg, scheme, seed)
  out.train.steps = steps
  out.train.init_from = init_from
  if max_len is not None:
    out.model.max_len = max_len
  return out


def attempt_dir(workdir: str, scheme: str, seed: int, index: int) -> str:
  run_dir = run_dir_of(workdir, scheme, seed)
  return run_dir if index == 0 else f"{run_dir}_retry{index}"


def warm_dir_of(run_dir: str, stage: int = 0) -> str:
  """Where an attempt's warm-up runs live: beside it, "<attempt dir>_warm", "_warm2", ..."""
  return run_dir + "_warm" + (str(stage + 1) if stage else "")


def warm_config(config, scheme: str, seed: int, retry: str, pairs: int, init_from: str = "",
                max_len: int | None = None):
  """A warm-up run's config: the attempt's, on items of exactly `pairs` pairs for
  kv_warm_steps steps (starting from init_from: the warm-up before it, or for the first the
  LM of the LM-pretrained variant)."""
  exp = config.experiment
  out = attempt_config(config, scheme, seed, retry, int(exp.kv_warm_steps), init_from, max_len)
  out.data.num_pairs = int(pairs)
  out.data.min_pairs = 0
  return out


def _warm_runs(config, run_dir, seed, scheme, retry, variant):
  """(directory, config) of each warm-up run of an attempt, each starting from the one before."""
  source, out = variant["init_from"], []
  for stage, pairs in enumerate(warm_pairs(config.experiment, retry)):
    warm_dir = warm_dir_of(run_dir, stage)
    out.append((warm_dir, warm_config(config, scheme, seed, retry, pairs, source,
                                      variant["max_len"])))
    source = warm_dir
  return out


def _warmed(config, workdir, scheme, seed, index, retry, variant, label) -> dict:
  """The attempt's variant with init_from its last warm-up run (each trained here if
  unfinished), or the variant unchanged when kv_warm_steps is 0."""
  for warm_dir, cfg in _warm_runs(config, attempt_dir(workdir, scheme, seed, index), seed,
                                  scheme, retry, variant):
    summary = read_summary(warm_dir)
    if summary is None or summary["step"] != cfg.train.steps:
      print(f"== warm-up of {label} seed {seed}: {cfg.train.steps} steps on "
            f"{cfg.data.num_pairs} pairs in {warm_dir}", flush=True)
      loop.train_and_evaluate(cfg, warm_dir)
      if (read_summary(warm_dir) or {}).get("step") != cfg.train.steps:
        sys.exit(f"the warm-up of {label} seed {seed} stopped early; re-run the same command "
                 f"to resume")
    variant = {**variant, "init_from": warm_dir}
  return variant


def read_summary(run_dir: str) -> dict | None:
  path = os.path.join(run_dir, "summary.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def check_finished(config, workdir: str, scheme: str, seeds, init_from=None,
                   max_len: int | None = None) -> None:
  """Refuse, before anything trains, a finished stage of any attempt that was trained with
  other settings than these (train.steps aside: stages differ only in it)."""
  for seed in seeds:
    for index, retry in enumerate(attempts(config, scheme, init_from is not None)):
      run_dir = attempt_dir(workdir, scheme, seed, index)
      source = init_from(seed) if init_from else ""
      for warm_dir, cfg in _warm_runs(config, run_dir, seed, scheme, retry,
                                      {"init_from": source, "max_len": max_len}):
        summary = read_summary(warm_dir)
        if summary is not None:
          check_finished_run(cfg, warm_dir, summary)
        source = warm_dir
      summary = read_summary(run_dir)
      if summary is not None:
        cfg = attempt_config(config, scheme, seed, retry, summary["step"], source, max_len)
        check_finished_run(cfg, run_dir, summary)


def _cache_key(exp, step: int) -> str:
  # A run directory holds one run (a finished one of other settings is refused, and a run
  # trained again from scratch starts without this file), so the step and the check's own
  # settings identify a check.
  return json.dumps({"step": step, "pairs": exp.kv_train_pairs, "items": exp.kv_check_items,
                     "seed": exp.seed, "version": CHECK_VERSION}, sort_keys=True)


def _checked(run_dir: str, exp, step: int) -> dict | None:
  path = os.path.join(run_dir, "criterion.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get(_cache_key(exp, step))


def _save_check(run_dir: str, exp, step: int, check: dict) -> None:
  path = os.path.join(run_dir, "criterion.json")
  cache = {}
  if os.path.exists(path):
    with open(path) as f:
      cache = json.load(f)
  cache[_cache_key(exp, step)] = check
  with open(path + ".tmp", "w") as f:
    json.dump(cache, f)
  os.replace(path + ".tmp", path)


def _train_attempt(config, workdir, scheme, seed, index, retry, variant, label) -> dict:
  """Stages of one attempt until the criterion is met or the cap is reached."""
  exp = config.experiment
  run_dir = attempt_dir(workdir, scheme, seed, index)
  checks = []
  # A warm-up finishes before its attempt starts, so this trains only for a new attempt.
  variant = _warmed(config, workdir, scheme, seed, index, retry, variant, label)
  for steps in stages(exp, split_retry(retry)[1]):
    summary = read_summary(run_dir)
    check = _checked(run_dir, exp, steps)
    if check is None and summary is not None and summary["step"] > steps:
      # Trained past this stage before this check existed (its settings changed): checked
      # now if that step's checkpoint is still kept, skipped otherwise.
      try:
        check = check_accuracy(run_dir, steps, exp)
      except FileNotFoundError:
        continue
      _save_check(run_dir, exp, steps, check)
    if check is None:
      if summary is None or summary["step"] != steps:
        print(f"== training {label} seed {seed}{f' (retry {index}: {retry})' if index else ''}"
              f" to step {steps} in {run_dir}", flush=True)
        loop.train_and_evaluate(attempt_config(config, scheme, seed, retry, steps, **variant),
                                run_dir)
        summary = read_summary(run_dir)
        if summary is None or summary["step"] != steps:  # stopped by a signal; saved
          sys.exit(f"training {label} seed {seed} stopped before step {steps}; re-run the "
                   f"same command to resume")
      check = check_accuracy(run_dir, steps, exp)
      _save_check(run_dir, exp, steps, check)
    checks.append(check)
    print(f"   {label} seed {seed} step {steps}: criterion check {check['accuracy']:.3f} "
          f"(n={check['n']}, needs >= {exp.kv_criterion})", flush=True)
    if check["accuracy"] >= exp.kv_criterion:
      break
  met = bool(checks) and checks[-1]["accuracy"] >= exp.kv_criterion
  pairs = warm_pairs(exp, retry)
  warms = [read_summary(warm_dir_of(run_dir, i)) or {} for i in range(len(pairs))]
  return {"retry": index, "settings": retry or "(the scheme's own)", "run_dir": run_dir,
          "warm": _warm_record(run_dir, pairs, warms),
          "checks": checks, "met": met, "step": checks[-1]["step"] if checks else None,
          "wall_time_s": (read_summary(run_dir) or {}).get("wall_time_s")}


def _warm_record(run_dir, pairs, warms) -> dict | None:
  """What came before an attempt's stages. One warm-up run: its pairs as a number; a
  curriculum: the list, with the runs' steps and wall times summed."""
  if not warms:
    return None
  return {"run_dir": warm_dir_of(run_dir, len(pairs) - 1),
          "steps": sum(w.get("step", 0) for w in warms),
          "pairs": pairs[0] if len(pairs) == 1 else list(pairs),
          "wall_time_s": sum(w.get("wall_time_s") or 0 for w in warms)}


def train_to_criterion(config, workdir: str, scheme: str, seeds, label: str | None = None,
                       init_from=None, max_len: int | None = None) -> dict:
  """{seed: record} for one scheme: record = met, the step it was met at (steps_to_criterion,
  None when never), the attempt evaluated (run_dir, step) and every attempt's checks.
  init_from: seed -> the LM run to start from (the LM-pretrained variant).

  The settings are tried in order on the first seed; one that meets the criterion there
  trains every seed. It is the scheme's when every seed meets it; when another seed falls
  short, the search goes on with the next entry, on the first seed again (a setting that
  works for one seed in three is not a tuned one). Each seed reports the accepted setting's
  attempt, or, when none was accepted, that of the setting most seeds met (the earliest of
  a tie); a seed never trained with it says why."""
  label = label or scheme
  tries = attempts(config, scheme, init_from is not None)
  seeds = list(seeds)
  tried = {seed: {} for seed in seeds}  # seed -> {attempt index: record}
  for index in range(len(tries)):
    for n, seed in enumerate(seeds):
      variant = {"init_from": init_from(seed) if init_from else "", "max_len": max_len}
      tried[seed][index] = _train_attempt(config, workdir, scheme, seed, index, tries[index],
                                          variant, label)
      if n == 0 and not tried[seed][index]["met"]:
        break  # the first seed searches alone
    if all(tried[seed].get(index, {}).get("met") for seed in seeds):
      break
  met = {i: sum(bool(tried[s].get(i, {}).get("met")) for s in seeds) for i in range(len(tries))}
  chosen = max(met, key=lambda i: (met[i], -i)) if any(met.values()) else None
  out = {}
  for seed in seeds:
    records = [tried[seed][i] for i in sorted(tried[seed])]
    last = tried[seed].get(chosen) if chosen is not None else (records[-1] if records else None)
    if last is None:
      out[seed] = {"met": False, "steps_to_criterion": None, "attempts": records,
                   "why": "not trained: no setting met the criterion on the first seed"}
      continue
    out[seed] = {"met": last["met"], "steps_to_criterion": last["step"] if last["met"] else None,
                 "run_dir": last["run_dir"], "step": last["step"], "settings": last["settings"],
                 "attempts": records}
  return out
