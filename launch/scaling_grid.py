"""The scaling kind of sweep: sizes x IsoFLOP budgets (or token budgets, or tokens per
parameter), each size's shape from experiments/scaling/shapes.py, steps from the budget, and the
corrected study's keys (Porian et al. 2024: batch per budget, a window around the predicted
optimum, seeds at the sizes nearest it, the lr law, warmup in tokens per parameter, eval tokens,
data-limited pruning). The keys are in launch/sweep.py's default_config()."""

import json
import math
import os

from experiments.scaling import shapes
from launch.sweep_values import numbers, run_name, short


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_repo(path: str) -> str:
  """A relative path missing here, under the repository if it is there: configs name their
  committed results (configs/scaling.py) from the root, and a launcher may run elsewhere."""
  if os.path.isabs(path) or os.path.exists(path):
    return path
  return os.path.join(_ROOT, path) if os.path.exists(os.path.join(_ROOT, path)) else path


def _lr_law(text: str):
  """(coef, exponent, convention) from "COEF,EXPONENT" or a json written by
  experiments/scaling/lr_law.py; None for ""."""
  if not text:
    return None
  if text.endswith(".json"):
    text = _in_repo(text)
    if not os.path.exists(text):
      where = "" if os.path.isabs(text) else f" here or under {_ROOT}"
      raise ValueError(f"sweep.lr_law: {text} does not exist{where}; run the learning-rate "
                       f"sweep and `python -m experiments.scaling.lr_law` first (experiments/"
                       f"scaling/README.md), or give --config.sweep.lr_law=COEF,EXPONENT")
    with open(text) as f:
      law = json.load(f)
    return float(law["coef"]), float(law["exponent"]), law.get("convention")
  parts = [p for p in text.split(",") if p.strip()]
  if len(parts) != 2:
    raise ValueError(f"sweep.lr_law must be 'COEF,EXPONENT' or a .json path, got {text!r}")
  return float(parts[0]), float(parts[1]), None


def config_capped(sweep) -> set[str]:
  """The keys whose runs' values the design caps at the config's, so a launcher's --config
  flag for them takes effect (launch/sweep.py refuses one for any other key a run sets)."""
  keys = {"train.log_every", "train.eval_every", "train.checkpoint_every"}
  return keys if sweep.get("warmup_tokens_per_param", 0) else keys | {"opt.warmup_steps"}


def _predicted_optimum(budget: float, ratio: float) -> float:
  return math.sqrt(budget / (6 * ratio))  # C = 6 N D, D = ratio N


def _priors(get, targets: list[float], isoflop: bool) -> list[float]:
  """The predicted D/N at each budget: tokens_per_param_priors (one per budget) or the one
  tokens_per_param_prior for all."""
  text = get("tokens_per_param_priors", "")
  if not text:
    return [get("tokens_per_param_prior", 20.0)] * len(targets)
  priors = numbers(text, "tokens_per_param_priors")
  if not isoflop or len(priors) != len(targets):
    raise ValueError(f"sweep.tokens_per_param_priors gives {len(priors)} priors; give one per "
                     f"IsoFLOP budget ({len(targets) if isoflop else 0}), or leave it empty")
  return priors


def _nearest(sizes: list[float], centre: float, count: int) -> set[float]:
  """The `count` sizes nearest `centre` in log scale (all of them for count 0 or no centre)."""
  ranked = sorted(sizes, key=lambda n: abs(math.log(n / centre)) if centre else 0)
  return set(ranked[:count] if count else ranked)


def expand(config, sweep) -> list[dict]:
  if sweep.axes:
    raise ValueError("sweep.axes is for grid/random sweeps; a scaling sweep takes sizes and "
                     "budgets or tokens")
  sizes = numbers(sweep.sizes, "sizes")
  by_ratio = bool(sweep.get("tokens_per_param", 0))
  if by_ratio + bool(sweep.budgets) + bool(sweep.tokens) != 1:
    raise ValueError("a scaling sweep needs exactly one of sweep.budgets (FLOPs), "
                     "sweep.tokens and sweep.tokens_per_param")
  isoflop = bool(sweep.budgets)
  targets = ([sweep.tokens_per_param] if by_ratio else
             numbers(sweep.budgets if isoflop else sweep.tokens,
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
  batches = [int(b) for b in numbers(get("batch_sizes", ""), "batch_sizes")] \
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
  lrs = numbers(get("lrs", ""), "lrs") if get("lrs", "") else [None]
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
        count=size_conv, vocab_size=vocab if size_conv == "total" else 0, tie_embeddings=tie,
        ffn_fallback=tuple(int(r) for r in numbers(get("ffn_fallback", ""), "ffn_fallback"))
        if get("ffn_fallback", "") else ())
    model = config.model.to_dict() | shape
    models[size] = (shape, shapes.param_counts(model),
                    {c: shapes.flops_per_token(model, seq_len, c)
                     for c in shapes.FLOPS_CONVENTIONS})
  priors = _priors(get, targets, isoflop)
  minima = numbers(get("seed_minima", ""), "seed_minima") if get("seed_minima", "") else []
  if minima and (not isoflop or len(minima) != len(targets)):
    raise ValueError(f"sweep.seed_minima gives {len(minima)} sizes; give one measured minimum "
                     f"per IsoFLOP budget ({len(targets) if isoflop else 0}), or leave it empty")
  runs = []
  for k, (target, budget_batch, prior) in enumerate(zip(targets, batches, priors)):
    chosen = list(sizes)
    centre = _predicted_optimum(target, prior) if isoflop else 0
    if isoflop and get("window", 0):
      below = get("window_below", 0) or get("window", 0)
      chosen = [n for n in chosen
                if -below - 1e-9 <= math.log10(n / centre) <= get("window", 0) + 1e-9]
    if isoflop and get("max_sizes", 0):
      keep = sorted(chosen, key=lambda n: abs(math.log(n / centre)))[:get("max_sizes", 0)]
      chosen = [n for n in chosen if n in keep]
    seeded = _nearest(chosen, centre, get("seed_sizes", 0))
    if isoflop and get("seed_tokens_per_param", 0):
      seeded |= _nearest(chosen, _predicted_optimum(target, get("seed_tokens_per_param", 0)),
                         get("seed_sizes", 0))
    if minima:  # seeds at the sizes nearest each budget's measured minimum too
      seeded |= _nearest(chosen, minima[k], get("seed_sizes", 0))
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
      label = {"N": short(size)}
      if isoflop:
        label["C"] = short(target)
      elif by_ratio:
        label["D/N"] = short(target)
      else:
        label["D"] = short(target)
      for lr in lrs:
        run_overrides = dict(overrides)
        lr_label = dict(label)
        if lr is not None:
          run_overrides["opt.lr"] = lr
          lr_label["lr"] = short(lr)
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
  if get("run_order", "size") not in ("size", "budget"):
    raise ValueError(f"sweep.run_order must be size or budget, got {get('run_order', '')!r}")
  if get("run_order", "size") == "size":
    runs.sort(key=lambda r: sizes.index(r["target_size"]))  # size-major, as always (stable)
  # "budget": as expanded, budget by budget, so a sweep cut short has whole IsoFLOP curves.
  if not runs:
    raise ValueError("the scaling design is empty: every (size, budget) pair trains for fewer "
                     "than sweep.min_steps steps, falls outside the tokens-per-param range, or "
                     "repeats the data more than sweep.max_epochs times")
  return runs
