"""Retrieval models trained to a stated criterion (lost in the middle, issue 19).

Every retrieval model trains in stages: kv_steps, then kv_extend_steps more at a time up to
kv_max_steps (the cap). After each stage a held-out check, kv_check_items items of
kv_train_pairs pairs (the training context length) with the query at a uniformly drawn
position, from a random stream the training set and the evaluation grid never use, decides:
exact-match accuracy >= kv_criterion stops training there. A run that reaches the cap below it
is retried once per entry of experiment.kv_retry.<scheme> ("opt.lr=3e-4;opt.warmup_steps=500",
entries separated by "|"), each a new run on the first seed; the other seeds train with the
settings that met the criterion, and not at all when none did. A retry entry may raise its
own cap with "kv_max_steps=N" (tuning the steps, as issue 19 asks of RoPE); the other entries
are config overrides. A scheme that never meets it is a training failure: reported, never
compared.

With kv_warm_steps > 0 every attempt first trains a warm-up run, kv_warm_steps on items of
exactly kv_warm_pairs pairs with the attempt's settings, in "<attempt dir>_warm", and its
stages start from those parameters (train.init_from; fresh optimizer and schedule). Trained
on 2-32 pairs from the start every model stayed at chance for 2000 steps; ALiBi learns 4-pair
items in 1000 and carries the lookup to 2-32 pairs (experiments/probes/README.md). The
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
  from experiments.probes.run import wilson  # noqa: PLC0415 (run imports this module)
  _, model_config, params, tokenizer = records.load(run_dir, step)
  items = check_items(exp.kv_train_pairs, exp.kv_check_items, exp.seed)
  _, exact = Scorer(model_config, params).continuation_scores(
      tokenizer, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
  right = int(np.sum(exact))
  return {"step": step, "accuracy": right / len(items), "n": len(items),
          "wilson95": wilson(right, len(items))}


CAP_KEY = "kv_max_steps"  # in a retry entry: that attempt's own cap, not a config override


def split_cap(retry: str) -> tuple[str, int | None]:
  """"opt.lr=3e-4;kv_max_steps=3000" -> ("opt.lr=3e-4", 3000): an attempt's config overrides
  and its own cap (None: experiment.kv_max_steps)."""
  parts = [p.strip() for p in str(retry or "").split(";") if p.strip()]
  caps = [p for p in parts if p.partition("=")[0].strip() == CAP_KEY]
  rest = ";".join(p for p in parts if p not in caps)
  if not caps:
    return rest, None
  value = caps[-1].partition("=")[2].strip()
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f"{CAP_KEY}={value!r} in a kv_retry entry: a whole number of steps >= 1")
  return rest, int(value)


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
  warm_steps, warm_pairs = int(exp.get("kv_warm_steps", 0)), int(exp.get("kv_warm_pairs", 0))
  if warm_steps < 0 or (warm_steps and not 1 <= warm_pairs <= int(exp.kv_train_pairs)):
    raise ValueError(f"experiment.kv_warm_steps={warm_steps}, kv_warm_pairs={warm_pairs}: "
                     f"need kv_warm_steps >= 0 (0: no warm-up) and 1 <= kv_warm_pairs <= "
                     f"kv_train_pairs={exp.kv_train_pairs}")


def attempts(config, scheme: str) -> list[str]:
  """The settings tried in order: the scheme's own (""), then its kv_retry entries."""
  table = config.experiment.get("kv_retry")
  text = (table.get(scheme, "") if table is not None else "") or ""
  retries = [t.strip() for t in str(text).split("|") if t.strip()]
  for r in retries:  # a typo fails before training
    overrides, cap = split_cap(r)
    parse_overrides(overrides, f"experiment.kv_retry.{scheme}")
    stages(config.experiment, cap)
  return [""] + retries


def attempt_config(config, scheme: str, seed: int, retry: str, steps: int,
                   init_from: str = "", max_len: int | None = None):
  """One attempt's training config at `steps` steps: the scheme's config (kv_overrides) with
  the retry's settings over it; for the LM-pretrained variant, init_from and the LM's
  max_len (the parameters restore only into the same model)."""
  cfg = ml_collections.ConfigDict(config.to_dict())
  own = cfg.experiment.overrides.get(scheme, "") or ""
  cfg.experiment.overrides[scheme] = ";".join(x for x in (own, split_cap(retry)[0]) if x)
  out = scheme_config(cfg, scheme, seed)
  out.train.steps = steps
  out.train.init_from = init_from
  if max_len is not None:
    out.model.max_len = max_len
  return out


def attempt_dir(workdir: str, scheme: str, seed: int, index: int) -> str:
  run_dir = run_dir_of(workdir, scheme, seed)
  return run_dir if index == 0 else f"{run_dir}_retry{index}"


def warm_dir_of(run_dir: str) -> str:
  """Where an attempt's warm-up run lives: beside it, "<attempt dir>_warm"."""
  return run_dir + "_warm"


def warm_config(config, scheme: str, seed: int, retry: str, init_from: str = "",
                max_len: int | None = None):
  """The warm-up run's config: the attempt's, on items of exactly kv_warm_pairs pairs for
  kv_warm_steps steps (starting from init_from: the LM for the LM-pretrained variant)."""
  exp = config.experiment
  out = attempt_config(config, scheme, seed, retry, int(exp.kv_warm_steps), init_from, max_len)
  out.data.num_pairs = int(exp.kv_warm_pairs)
  out.data.min_pairs = 0
  return out


def _warmed(config, workdir, scheme, seed, index, retry, variant, label) -> dict:
  """The attempt's variant with init_from its warm-up run (trained here if unfinished), or
  the variant unchanged when kv_warm_steps is 0."""
  exp = config.experiment
  if not int(exp.get("kv_warm_steps", 0)):
    return variant
  warm_dir = warm_dir_of(attempt_dir(workdir, scheme, seed, index))
  cfg = warm_config(config, scheme, seed, retry, **variant)
  summary = read_summary(warm_dir)
  if summary is None or summary["step"] != cfg.train.steps:
    print(f"== warm-up of {label} seed {seed}: {cfg.train.steps} steps on {exp.kv_warm_pairs} "
          f"pairs in {warm_dir}", flush=True)
    loop.train_and_evaluate(cfg, warm_dir)
    if (read_summary(warm_dir) or {}).get("step") != cfg.train.steps:
      sys.exit(f"the warm-up of {label} seed {seed} stopped early; re-run the same command "
               f"to resume")
  return {**variant, "init_from": warm_dir}


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
  warm = int(config.experiment.get("kv_warm_steps", 0))
  for seed in seeds:
    for index, retry in enumerate(attempts(config, scheme)):
      run_dir = attempt_dir(workdir, scheme, seed, index)
      source = init_from(seed) if init_from else ""
      if warm:
        summary = read_summary(warm_dir_of(run_dir))
        if summary is not None:
          check_finished_run(warm_config(config, scheme, seed, retry, source, max_len),
                             warm_dir_of(run_dir), summary)
        source = warm_dir_of(run_dir)
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
  for steps in stages(exp, split_cap(retry)[1]):
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
  warm = read_summary(warm_dir_of(run_dir)) if int(exp.get("kv_warm_steps", 0)) else None
  return {"retry": index, "settings": retry or "(the scheme's own)", "run_dir": run_dir,
          "warm": warm and {"run_dir": warm_dir_of(run_dir), "steps": warm["step"],
                            "pairs": int(exp.kv_warm_pairs),
                            "wall_time_s": warm.get("wall_time_s")},
          "checks": checks, "met": met, "step": checks[-1]["step"] if checks else None,
          "wall_time_s": (read_summary(run_dir) or {}).get("wall_time_s")}


def train_to_criterion(config, workdir: str, scheme: str, seeds, label: str | None = None,
                       init_from=None, max_len: int | None = None) -> dict:
  """{seed: record} for one scheme: record = met, the step it was met at (steps_to_criterion,
  None when never), the attempt evaluated (run_dir, step) and every attempt's checks.
  init_from: seed -> the LM run to start from (the LM-pretrained variant)."""
  label = label or scheme
  tries = attempts(config, scheme)
  out, chosen = {}, None
  for seed in seeds:
    variant = {"init_from": init_from(seed) if init_from else "", "max_len": max_len}
    # The first seed searches the attempts; the others use the one that met the criterion.
    indices = range(len(tries)) if chosen is None and not out else (
        [chosen] if chosen is not None else [])
    records = []
    for index in indices:
      records.append(_train_attempt(config, workdir, scheme, seed, index, tries[index],
                                    variant, label))
      if records[-1]["met"]:
        chosen = index
        break
    if not records:
      out[seed] = {"met": False, "steps_to_criterion": None, "attempts": [],
                   "why": "not trained: no setting met the criterion on the first seed"}
      continue
    last = records[-1]
    out[seed] = {"met": last["met"], "steps_to_criterion": last["step"] if last["met"] else None,
                 "run_dir": last["run_dir"], "step": last["step"], "settings": last["settings"],
                 "attempts": records}
  return out
