"""A sweep declaration -> a list of runs, the layout of a sweep directory, and its results table.

A sweep is the `sweep` sub-dict of a config (`default_config()` below is its schema):

  kind="grid"     axes="opt.lr=1e-4,3e-4,1e-3;model.d_model=128,256"   every combination
  kind="random"   axes="opt.lr=loguniform(1e-4,1e-2);model.d_model=choice(128,256)"
                  trials=16, seed=0                                     seeded draws
  kind="scaling"  sizes="1e5,3e5,1e6" (target non-embedding params) and either
                  budgets="1e13,3e13" (IsoFLOP, training FLOPs) or tokens="2e6,8e6"

                  or tokens_per_param=20 (D = 20 N), with lrs="1e-3,2e-3" an lr axis
A scaling run gets its shape from experiments/scaling/shapes.py and its steps from
C = flops_per_token * tokens (tokens = steps * batch_size * seq_len), so budgets are exact up
to the rounding of steps; sweep.flops_convention says whether C counts non-embedding
(Kaplan, the default) or total parameters (Chinchilla / Porian), and every run records both
(`flops`, `flops_total`). The corrected study's keys (batch per budget, a window around the
predicted optimum, seeds, lr law, warmup in tokens per parameter, eval tokens, data-limited
pruning) are in default_config(); their defaults keep the original behaviour. Every run is `transformer.train` with `--config.KEY=VALUE` overrides
in DIR/<name>/, where the name is made from the values that vary, so re-declaring the same
sweep finds the same directories.

DIR/sweep.json records the design and every run; DIR/<name>/summary.json marks a finished run.
`python -m launch.sweep --workdir DIR` rewrites and prints DIR/results.md.
"""

import hashlib
import itertools
import json
import math
import os
import re

import ml_collections
import numpy as np
from absl import flags as absl_flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path, tuple_parser

from experiments.scaling import shapes
# What a sweep directory holds on disk; sweep.is_finished / read_sweep / write_results stay
# callable here for the launchers.
from launch.sweep_dir import (atomic_write, format_cell, is_finished, read_sweep,  # noqa: F401
                              results_table, write_results)


def default_config() -> ml_collections.ConfigDict:
  """The sweep schema; every sweep kind reads only its own keys."""
  return ml_collections.ConfigDict(dict(
      kind="grid",  # grid | random | scaling
      axes="",  # grid/random: "key=values;key=values" (see module docstring)
      trials=8,  # random
      seed=0,  # random
      # scaling: sizes x (budgets | tokens)
      sizes="",  # target non-embedding parameter counts
      budgets="",  # IsoFLOP training budgets in FLOPs
      tokens="",  # token budgets (instead of budgets)
      aspect_ratio=32.0,  # d_model / num_layers of the shape rule
      head_dim=32,
      ffn_ratio=4,  # d_ff / d_model
      min_steps=20,  # IsoFLOP points that would train for fewer steps are dropped
      min_tokens_per_param=0.0,  # ... and those outside this range of D / N (0: no bound)
      max_tokens_per_param=0.0,
      # --- the corrected study (Porian et al. 2024); the defaults keep the original design ---
      size_convention="non_embedding",  # what `sizes` count: non_embedding | total
      flops_convention="non_embedding",  # C per token of `budgets`: non_embedding | total
      min_layers=1,  # shape rule: at least this many layers ...
      min_heads=1,  # ... and heads
      small_head_dim=0,  # head_dim below d_model 64 (0: head_dim throughout)
      batch_sizes="",  # one batch size (sequences) per budget, same order; "": train.batch_size
      batch_by="budget",  # batch_sizes are per budget, or per size (same order as sizes)
      window=0.0,  # > 0: per budget only sizes within +-window decades of the predicted optimum
      window_below=0.0,  # > 0: ... but this many decades below it (a second stage that
                         # brackets minima measured left of the prediction); 0: window
      max_sizes=0,  # > 0: at most this many sizes per budget, the nearest the predicted optimum
      tokens_per_param_prior=20.0,  # predicted optimum: D/N = this, so N = sqrt(C / (6 r))
      seeds=1,  # train.seed = 0 .. seeds-1 ...
      seed_sizes=0,  # ... at the seed_sizes sizes nearest each budget's predicted optimum (0: all)
      seed_tokens_per_param=0.0,  # > 0: and at the seed_sizes nearest sqrt(C / (6 r)) for
                                  # r = this (the measured D/N at the minima, second stage)
      lrs="",  # a learning-rate axis: every (size, budget) at each of these opt.lr
      tokens_per_param=0.0,  # > 0: D = this x N (the lr sweep's ~20), instead of budgets/tokens
      lr_law="",  # "COEF,EXPONENT" or a json {coef, exponent}: opt.lr = COEF * N^EXPONENT
      warmup_tokens_per_param=0.0,  # > 0: warmup = this x N tokens, capped at 10% of the run
      eval_tokens=0,  # > 0: train.eval_batches covers at least this many tokens
      eval_points=10,  # evaluations (and checkpoints) per run
      dataset_tokens=0.0,  # > 0: budgets whose runs would see more than max_epochs x this ...
      max_epochs=4.0,  # ... tokens are pruned (data-limited corpora: python_stdlib)
  ))


# --- parsing "key=values;key=values" ----------------------------------------------------------

def _scalar(text: str):
  text = text.strip()
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def _numbers(text: str, what: str) -> list[float]:
  values = [_scalar(v) for v in text.split(",") if v.strip()]
  if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
    raise ValueError(f"sweep.{what} must be positive numbers like '1e5,3e5', got {text!r}")
  return [float(v) for v in values]


def _axes(text: str) -> list[tuple[str, str]]:
  axes = []
  for part in filter(str.strip, text.split(";")):
    key, sep, values = part.partition("=")
    if not sep or not key.strip() or not values.strip():
      raise ValueError(f"sweep axis {part!r} is not KEY=VALUES (e.g. opt.lr=1e-4,1e-3)")
    axes.append((key.strip(), values.strip()))
  if not axes:
    raise ValueError("sweep.axes is empty; e.g. 'opt.lr=1e-4,1e-3;model.d_model=128,256'")
  return axes


def _round(x: float) -> float:
  return float(f"{x:.3g}")  # draws with 3 significant digits keep names and configs readable


# Random-search distributions: name -> draw(rng, args) of one value.
DISTRIBUTIONS = {
    "choice": lambda rng, args: args[rng.integers(len(args))],
    "uniform": lambda rng, args: _round(rng.uniform(args[0], args[1])),
    "loguniform": lambda rng, args: _round(math.exp(rng.uniform(*np.log(args[:2])))),
    "int": lambda rng, args: int(rng.integers(int(args[0]), int(args[1]) + 1)),  # inclusive
}


def _distribution(key: str, text: str):
  match = re.fullmatch(r"(\w+)\((.*)\)", text)
  if not match or match.group(1) not in DISTRIBUTIONS:
    raise ValueError(f"random axis {key}={text!r}: want NAME(args) with NAME one of "
                     f"{sorted(DISTRIBUTIONS)}")
  name, args = match.group(1), [_scalar(a) for a in match.group(2).split(",")]
  if name != "choice" and (len(args) != 2 or not all(isinstance(a, (int, float)) for a in args)):
    raise ValueError(f"random axis {key}={text!r}: {name} takes two numbers (low, high)")
  return lambda rng: DISTRIBUTIONS[name](rng, args)


# --- run names ----------------------------------------------------------------------------------

def _short(x: float) -> str:
  return f"{x:.3g}".replace("e+0", "e").replace("e+", "e")  # 1e+13 -> 1e13


def run_name(values: dict) -> str:
  """Deterministic directory name from the values that define a run: 'lr=0.001,d_model=256'.

  Keys are shortened to their last component unless two would collide; unsafe characters
  become '_'; names past 120 characters are cut and end in a hash of the full name.
  """
  leaves = [k.rsplit(".", 1)[-1] for k in values]
  keys = [leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(values, leaves)]
  name = ",".join(f"{k}={format_cell(v)}" for k, v in zip(keys, values.values()))
  name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)
  if len(name) > 120:
    name = name[:111] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
  return name


# --- expansion ---------------------------------------------------------------------------------

def _grid(config, sweep) -> list[dict]:
  axes = [(k, [_scalar(v) for v in values.split(",")]) for k, values in _axes(sweep.axes)]
  runs = []
  for combo in itertools.product(*(values for _, values in axes)):
    overrides = dict(zip((k for k, _ in axes), combo))
    runs.append(dict(name=run_name(overrides), overrides=overrides))
  return runs


def _random(config, sweep) -> list[dict]:
  axes = [(k, _distribution(k, text)) for k, text in _axes(sweep.axes)]
  rng = np.random.default_rng(sweep.seed)
  runs, seen = [], set()
  for _ in range(sweep.trials):
    overrides = {k: draw(rng) for k, draw in axes}
    name = run_name(overrides)
    if name not in seen:  # a repeated draw (e.g. of a small choice) would share a workdir
      seen.add(name)
      runs.append(dict(name=name, overrides=overrides))
  return runs


def _lr_law(text: str):
  """(coef, exponent, convention) from "COEF,EXPONENT" or a json written by
  experiments/scaling/lr_law.py; None for ""."""
  if not text:
    return None
  if text.endswith(".json"):
    if not os.path.exists(text):
      raise ValueError(f"sweep.lr_law: {text} does not exist; run the learning-rate sweep and "
                       f"`python -m experiments.scaling.lr_law` first (experiments/scaling/"
                       f"README.md), or give --config.sweep.lr_law=COEF,EXPONENT")
    with open(text) as f:
      law = json.load(f)
    return float(law["coef"]), float(law["exponent"]), law.get("convention")
  parts = [p for p in text.split(",") if p.strip()]
  if len(parts) != 2:
    raise ValueError(f"sweep.lr_law must be 'COEF,EXPONENT' or a .json path, got {text!r}")
  return float(parts[0]), float(parts[1]), None


def _predicted_optimum(budget: float, ratio: float) -> float:
  return math.sqrt(budget / (6 * ratio))  # C = 6 N D, D = ratio N


def _nearest(sizes: list[float], centre: float, count: int) -> set[float]:
  """The `count` sizes nearest `centre` in log scale (all of them for count 0 or no centre)."""
  ranked = sorted(sizes, key=lambda n: abs(math.log(n / centre)) if centre else 0)
  return set(ranked[:count] if count else ranked)


def _scaling(config, sweep) -> list[dict]:
  if sweep.axes:
    raise ValueError("sweep.axes is for grid/random sweeps; a scaling sweep takes sizes and "
                     "budgets or tokens")
  sizes = _numbers(sweep.sizes, "sizes")
  by_ratio = bool(sweep.get("tokens_per_param", 0))
  if by_ratio + bool(sweep.budgets) + bool(sweep.tokens) != 1:
    raise ValueError("a scaling sweep needs exactly one of sweep.budgets (FLOPs), "
                     "sweep.tokens and sweep.tokens_per_param")
  isoflop = bool(sweep.budgets)
  targets = ([sweep.tokens_per_param] if by_ratio else
             _numbers(sweep.budgets if isoflop else sweep.tokens,
                      "budgets" if isoflop else "tokens"))
  get = lambda key, default: sweep.get(key, default)
  size_conv, flops_conv = get("size_convention", "non_embedding"), get("flops_convention",
                                                                       "non_embedding")
  for what, value in (("size_convention", size_conv), ("flops_convention", flops_conv)):
    if value not in shapes.FLOPS_CONVENTIONS:
      raise ValueError(f"sweep.{what} must be one of {sorted(shapes.FLOPS_CONVENTIONS)}, "
                       f"got {value!r}")
  per_size = get("batch_by", "budget") == "size"
  if get("batch_by", "budget") not in ("budget", "size"):
    raise ValueError(f"sweep.batch_by must be budget or size, got {get('batch_by', '')!r}")
  batches = [int(b) for b in _numbers(get("batch_sizes", ""), "batch_sizes")] \
      if get("batch_sizes", "") else [config.train.batch_size] * (len(sizes) if per_size
                                                                    else len(targets))
  if len(batches) != (len(sizes) if per_size else len(targets)):
    raise ValueError(f"sweep.batch_sizes gives {len(batches)} batch sizes for "
                     f"{len(sizes) if per_size else len(targets)} "
                     f"{'sizes' if per_size else 'budgets'}; give one per "
                     f"{get('batch_by', 'budget')}")
  size_batch = dict(zip(sizes, batches)) if per_size else {}
  if per_size:
    batches = [None] * len(targets)
  lrs = _numbers(get("lrs", ""), "lrs") if get("lrs", "") else [None]
  law = _lr_law(get("lr_law", ""))
  if law and law[2] and law[2] != size_conv:
    raise ValueError(f"sweep.lr_law was fitted on {law[2]} parameters but the sweep counts "
                     f"{size_conv}")
  seq_len = config.data.seq_len
  vocab = config.model.get("vocab_size", 0)
  tie = config.model.get("tie_embeddings", True)
  models = {}
  for size in sizes:
    shape = shapes.shape_for_size(
        size, aspect_ratio=sweep.aspect_ratio, head_dim=sweep.head_dim,
        ffn_ratio=sweep.ffn_ratio, min_layers=get("min_layers", 1),
        min_heads=get("min_heads", 1), small_head_dim=get("small_head_dim", 0),
        count=size_conv, vocab_size=vocab if size_conv == "total" else 0, tie_embeddings=tie)
    model = config.model.to_dict() | shape
    models[size] = (shape, shapes.param_counts(model),
                    {c: shapes.flops_per_token(model, seq_len, c)
                     for c in shapes.FLOPS_CONVENTIONS})
  runs = []
  for target, budget_batch in zip(targets, batches):
    chosen = list(sizes)
    if isoflop and get("window", 0):
      centre = _predicted_optimum(target, get("tokens_per_param_prior", 20.0))
      below = get("window_below", 0) or get("window", 0)
      chosen = [n for n in chosen
                if -below - 1e-9 <= math.log10(n / centre) <= get("window", 0) + 1e-9]
    if isoflop and get("max_sizes", 0):
      centre = _predicted_optimum(target, get("tokens_per_param_prior", 20.0))
      keep = sorted(chosen, key=lambda n: abs(math.log(n / centre)))[:get("max_sizes", 0)]
      chosen = [n for n in chosen if n in keep]
    centre = _predicted_optimum(target, get("tokens_per_param_prior", 20.0)) if isoflop else 0
    seeded = _nearest(chosen, centre, get("seed_sizes", 0))
    if isoflop and get("seed_tokens_per_param", 0):
      seeded |= _nearest(chosen, _predicted_optimum(target, get("seed_tokens_per_param", 0)),
                         get("seed_sizes", 0))
    budget_runs = []
    for size in chosen:
      shape, counts, per_token = models[size]
      batch = size_batch.get(size, budget_batch)
      tokens_per_step = batch * seq_len
      n = counts[size_conv]
      if isoflop:
        tokens = target / per_token[flops_conv]
      elif by_ratio:
        tokens = target * n
      else:
        tokens = target
      steps = max(1, round(tokens / tokens_per_step))
      ratio = steps * tokens_per_step / n
      if isoflop and (steps < sweep.min_steps
                      or (sweep.min_tokens_per_param and ratio < sweep.min_tokens_per_param)
                      or (sweep.max_tokens_per_param and ratio > sweep.max_tokens_per_param)):
        continue
      overrides = {f"model.{k}": v for k, v in shape.items()}
      overrides["train.steps"] = steps
      if get("batch_sizes", ""):
        overrides["train.batch_size"] = batch
      # Short runs still log, evaluate and checkpoint ~eval_points times, so every run has a
      # loss curve for the compute frontier and an interrupted one loses little.
      points = max(1, get("eval_points", 10))
      for key in ("log_every", "eval_every", "checkpoint_every"):
        if key in config.train:
          overrides[f"train.{key}"] = max(1, min(config.train[key], steps // points))
      if get("eval_tokens", 0):
        overrides["train.eval_batches"] = math.ceil(get("eval_tokens", 0) / tokens_per_step)
      if get("warmup_tokens_per_param", 0):
        # Porian et al. 2024: warmup ~ N tokens; never more than a tenth of the run.
        warm = round(get("warmup_tokens_per_param", 0) * n / tokens_per_step)
        overrides["opt.warmup_steps"] = max(1, min(warm, steps // 10))
      elif "warmup_steps" in config.get("opt", {}):
        overrides["opt.warmup_steps"] = min(config.opt.warmup_steps, max(1, steps // 10))
      tokens = steps * tokens_per_step
      label = {"N": _short(size)}
      if isoflop:
        label["C"] = _short(target)
      elif by_ratio:
        label["D/N"] = _short(target)
      else:
        label["D"] = _short(target)
      for lr in lrs:
        run_overrides = dict(overrides)
        lr_label = dict(label)
        if lr is not None:
          run_overrides["opt.lr"] = lr
          lr_label["lr"] = _short(lr)
        elif law:
          run_overrides["opt.lr"] = float(f"{law[0] * n ** law[1]:.4g}")
        for seed in range(get("seeds", 1) if size in seeded else 1):
          seed_overrides, name = dict(run_overrides), dict(lr_label)
          if get("seeds", 1) > 1:
            seed_overrides["train.seed"] = seed
            if seed:
              name["seed"] = seed
          budget_runs.append(dict(
              name=run_name(name), overrides=seed_overrides, target_size=size,
              budget=target if isoflop else None,  # the IsoFLOP curve this run belongs to
              seed=seed, batch_size=batch, size_convention=size_conv,
              flops_convention=flops_conv,
              params_non_embedding=counts["non_embedding"], params_total=counts["total"],
              tokens=tokens, flops_per_token=per_token["non_embedding"],
              flops=tokens * per_token["non_embedding"],
              flops_per_token_total=per_token["total"], flops_total=tokens * per_token["total"]))
    if get("dataset_tokens", 0) and budget_runs:
      most = max(r["tokens"] for r in budget_runs)
      if most > get("max_epochs", 4.0) * get("dataset_tokens", 0):
        # A curve whose small models repeat the data more than max_epochs times measures
        # memorization, not scaling: the whole budget goes (see pruned_budgets()).
        continue
    runs += budget_runs
  runs.sort(key=lambda r: sizes.index(r["target_size"]))  # size-major, as always (stable)
  if not runs:
    raise ValueError("the scaling design is empty: every (size, budget) pair trains for fewer "
                     "than sweep.min_steps steps, falls outside the tokens-per-param range, or "
                     "repeats the data more than sweep.max_epochs times")
  return runs


def pruned_budgets(config) -> list[float]:
  """Budgets of a scaling sweep that expand() drops for repeating the data too often."""
  sweep = config.sweep
  if sweep.kind != "scaling" or not sweep.budgets or not sweep.get("dataset_tokens", 0):
    return []
  kept = {r["budget"] for r in expand(config)}
  return [b for b in _numbers(sweep.budgets, "budgets") if b not in kept]


KINDS = {"grid": _grid, "random": _random, "scaling": _scaling}


def expand(config) -> list[dict]:
  """The runs of `config.sweep`: dicts with `name`, `overrides` and, for scaling, the design."""
  if "sweep" not in config:
    raise ValueError("config has no `sweep` sub-dict; give one (see launch/sweep.py) or "
                     "pass --sweep to the launcher")
  sweep = config.sweep
  if sweep.kind not in KINDS:
    raise ValueError(f"unknown sweep kind {sweep.kind!r}; valid: {sorted(KINDS)}")
  runs = KINDS[sweep.kind](config, sweep)
  names = [r["name"] for r in runs]
  if len(set(names)) != len(names):
    twice = sorted({n for n in names if names.count(n) > 1})
    raise ValueError(f"runs {twice} would share a workdir: their values differ only past the "
                     "4 significant digits a run name keeps")
  for key in {k for r in runs for k in r["overrides"]}:
    _check_key(config, key)  # here, not after N runs each die on the same typo
  for r in runs:
    for key, value in r["overrides"].items():
      _check_value(config, key, value)  # ... or on a value of the wrong type
  return runs


# The parsers ml_collections gives a --config.KEY=VALUE flag, by the type of the field.
_PARSERS = {float: absl_flags.FloatParser(), bool: absl_flags.BooleanParser(),
            int: absl_flags.IntegerParser(), str: absl_flags.ArgumentParser(),
            tuple: tuple_parser.TupleParser()}


def _check_value(config, key: str, value) -> None:
  """Refuse a swept value that the run's --config.KEY flag would not parse, before any run
  is launched (each would fail on it after the launcher made its folder)."""
  kind = config_path.get_type(key, config)
  parser = _PARSERS.get(kind)
  if parser is None or config_path.get_value(key, config) is None:
    return  # a field without a type (None) takes any literal
  try:
    parser.parse(format_value(value))
  except (ValueError, TypeError, absl_flags.Error):
    article = "an" if kind.__name__[0] in "aeiou" else "a"
    raise ValueError(f"sweep value {value!r} for {key} is not {article} {kind.__name__} (the "
                     f"config has {config_path.get_value(key, config)!r})") from None


def _check_key(config, key: str) -> None:
  node = config
  for i, part in enumerate(key.split(".")):
    if not hasattr(node, "keys") or part not in node:
      where = ".".join(key.split(".")[:i]) or "the config"
      valid = sorted(node.keys()) if hasattr(node, "keys") else []
      raise ValueError(f"sweep key {key!r}: {where} has no {part!r}; valid: {valid}")
    node = node[part]


# --- the sweep directory -----------------------------------------------------------------------

def train_command(python: str, module: str, config_arg: str, run_dir: str, overrides: dict,
                  extra: tuple = ()) -> list[str]:
  """argv of one run; `extra` holds the launcher's own --config.* flags, passed on verbatim."""
  flags = [f"--config.{k}={format_value(v)}" for k, v in overrides.items()]
  return [python, "-m", module, f"--config={config_arg}", f"--workdir={run_dir}", *extra, *flags]


def format_value(value) -> str:
  """A value as a --config.KEY=VALUE flag reads it back (repr round-trips floats)."""
  if isinstance(value, (tuple, list)):
    return "(" + ",".join(format_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
  return repr(value) if isinstance(value, float) else str(value)


def with_sweep_flag(config, axes: str, trials: int):
  """`config` with its sweep set from --sweep/--trials (added if the config has none)."""
  if not axes:
    if trials:
      raise ValueError("--trials needs --sweep with the random-search axes")
    return config
  with config.unlocked():
    if "sweep" not in config:
      config.sweep = default_config()
  config.sweep.update(kind="random" if trials else "grid", axes=axes,
                      trials=trials or config.sweep.trials)
  return config


def passthrough_flags(config_flag) -> list[str]:
  """The launcher's own --config.KEY=VALUE overrides, for every run (not the sweep's keys)."""
  overrides = config_flags.get_override_values(config_flag)
  return [f"--config.{k}={format_value(v)}" for k, v in overrides.items()
          if not k.startswith("sweep.")]


def plan(config, workdir: str, *, config_arg: str, python: str = "python",
         module: str = "transformer.train", extra_flags=(), launcher=()) -> list[dict]:
  """expand(config) with each run's argv under `command`; writes DIR/sweep.json."""
  runs = expand(config)
  for r in runs:
    r["command"] = train_command(python, module, config_arg, os.path.join(workdir, r["name"]),
                                 r["overrides"], extra_flags)
  write_sweep_json(workdir, config, runs, list(launcher))
  return runs


def write_sweep_json(workdir: str, config, runs: list[dict], command: list[str]) -> str:
  """DIR/sweep.json, the sweep's record. A DIR holding another sweep is refused (its started
  runs would be skipped as finished, or mixed into this one's table); a changed plan that
  keeps every started run (a grid extended) is written, the earlier record kept as
  sweep.1.json, sweep.2.json, ..."""
  path = os.path.join(workdir, "sweep.json")
  os.makedirs(workdir, exist_ok=True)
  record = dict(sweep=config.sweep.to_dict(), command=command, runs=runs,
                flops_convention=shapes.FLOPS_CONVENTIONS["non_embedding"] + " (runs' `flops`)",
                flops_conventions=shapes.FLOPS_CONVENTIONS,
                budgets_convention=config.sweep.get("flops_convention", "non_embedding")
                if config.sweep.kind == "scaling" else None)
  if os.path.exists(path):
    with open(path) as f:
      earlier = json.load(f)
    check_same_sweep(workdir, earlier["runs"], runs)
    if [_run_identity(r) for r in earlier["runs"]] != [_run_identity(r) for r in runs]:
      n = 1
      while os.path.exists(os.path.join(workdir, f"sweep.{n}.json")):
        n += 1
      os.replace(path, os.path.join(workdir, f"sweep.{n}.json"))
  atomic_write(path, json.dumps(record, indent=2))
  return path


def _run_identity(run: dict) -> tuple:
  # A run is its name and its training command, less the interpreter (another venv) and
  # the run directory (the same DIR given relative or absolute).
  return run["name"], tuple(a for a in run["command"][1:] if not a.startswith("--workdir="))


def check_same_sweep(workdir: str, earlier: list[dict], runs: list[dict]) -> None:
  """Refuse a plan that drops or changes a run of DIR's sweep.json that has started."""
  planned = dict(_run_identity(r) for r in runs)
  for run in earlier:
    name, command = _run_identity(run)
    if os.path.isdir(os.path.join(workdir, name)) and planned.get(name) != command:
      what = "is not in this sweep" if name not in planned else "had another command"
      raise ValueError(f"{workdir} holds another sweep: its run {name!r} {what} (see "
                       f"sweep.json); use a new --workdir or the original command")


def main(argv):
  del argv
  from absl import flags
  workdir = flags.FLAGS.workdir
  if not os.path.exists(os.path.join(workdir, "sweep.json")) and not any(
      is_finished(os.path.join(workdir, n)) for n in
      (os.listdir(workdir) if os.path.isdir(workdir) else [])):
    # results.md of any other folder (an experiment's) is not this program's to rewrite.
    raise ValueError(f"{workdir} is not a sweep directory (no sweep.json, no finished runs "
                     f"in it)")
  print(open(write_results(workdir)).read(), end="")


if __name__ == "__main__":
  from absl import flags
  from transformer import cli

  flags.DEFINE_string("workdir", None, "Sweep directory: (re)write and print DIR/results.md.")
  cli.run(main, required=("workdir",))
