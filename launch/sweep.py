"""A sweep declaration -> a list of runs, the layout of a sweep directory, and its results table.

A sweep is the `sweep` sub-dict of a config (`default_config()` below is its schema):

  kind="grid"     axes="opt.lr=1e-4,3e-4,1e-3;model.d_model=128,256"   every combination
                  axes="mesh.shape=(-1,1,1),(2,1,1)"                    a tuple field's values
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

Beside it: launch/sweep_values.py (parsing the values, run names), launch/scaling_grid.py (the
scaling kind's expansion), launch/sweep_dir.py (reading a sweep directory, its results table).
"""

import itertools
import json
import os

import ml_collections
import numpy as np
from absl import flags as absl_flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path, tuple_parser

from experiments.scaling import shapes
from launch import scaling_grid, sweep_values
from launch.sweep_values import run_name  # noqa: F401  (sweep.run_name, as before)
# What a sweep directory holds on disk; sweep.is_finished / read_sweep / write_results stay
# callable here for the launchers.
from launch.sweep_dir import (atomic_write, check_finished_configs, is_finished,  # noqa: F401
                              read_sweep, results_table, write_results)
from transformer import schema


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
      ffn_fallback="",  # d_ff ratios tried in order where no ffn_ratio shape is within 10%
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
      tokens_per_param_priors="",  # ... or one D/N per budget (same order as budgets)
      run_order="size",  # the order runs start in: size (size-major) | budget (budget-major)
      seeds=1,  # train.seed = 0 .. seeds-1 ...
      seed_sizes=0,  # ... at the seed_sizes sizes nearest each budget's predicted optimum (0: all)
      seed_tokens_per_param=0.0,  # > 0: and at the seed_sizes nearest sqrt(C / (6 r)) for
                                  # r = this (the measured D/N at the minima, second stage)
      seed_minima="",  # one size per budget (a measured minimum): and at the seed_sizes nearest it
      lrs="",  # a learning-rate axis: every (size, budget) at each of these opt.lr
      tokens_per_param=0.0,  # > 0: D = this x N (the lr sweep's ~20), instead of budgets/tokens
      lr_law="",  # "COEF,EXPONENT" or a json {coef, exponent}: opt.lr = COEF * N^EXPONENT
      warmup_tokens_per_param=0.0,  # > 0: warmup = this x N tokens, capped at 10% of the run
      eval_tokens=0,  # > 0: train.eval_batches covers at least this many tokens
      eval_points=10,  # evaluations (and checkpoints) per run
      dataset_tokens=0.0,  # > 0: budgets whose runs would see more than max_epochs x this ...
      max_epochs=4.0,  # ... tokens are pruned (data-limited corpora: python_stdlib)
  ))


# --- expansion ---------------------------------------------------------------------------------

def _grid(config, sweep) -> list[dict]:
  axes = [(k, [_grid_value(config, k, v) for v in sweep_values.split(values)])
          for k, values in _axes(config, sweep)]
  runs = []
  for combo in itertools.product(*(values for _, values in axes)):
    overrides = dict(zip((k for k, _ in axes), combo))
    runs.append(dict(name=run_name(overrides), overrides=overrides))
  return runs


def _random(config, sweep) -> list[dict]:
  if sweep.trials < 1:  # no draws: a sweep.json of no runs, and nothing said
    raise ValueError(f"a random search needs trials >= 1 (--trials=N or sweep.trials), "
                     f"got {sweep.trials}")
  axes = [(k, sweep_values.distribution(k, text)) for k, text in _axes(config, sweep)]
  rng = np.random.default_rng(sweep.seed)
  runs, seen = [], set()
  for _ in range(sweep.trials):
    overrides = {k: _tuple_value(config, k, draw(rng)) for k, draw in axes}
    name = run_name(overrides)
    if name not in seen:  # a repeated draw (e.g. of a small choice) would share a workdir
      seen.add(name)
      runs.append(dict(name=name, overrides=overrides))
  return runs


def _axes(config, sweep) -> list[tuple[str, str]]:
  """The grid/random axes, each key checked first (a value's type is the key's field's)."""
  axes = sweep_values.axes(sweep.axes)
  for key, _ in axes:
    _check_key(config, key)
  return axes


def _grid_value(config, key: str, text: str):
  """One grid value; a random-search distribution there is refused (it is no float)."""
  if sweep_values.is_distribution(text):
    raise ValueError(f"sweep axis {key}={text.strip()} is a random-search distribution: give "
                     f"--trials=N (sweep.kind='random', sweep.trials=N) for N draws, or grid "
                     f"values like {key}=1e-4,1e-3")
  return _tuple_value(config, key, sweep_values.scalar(text))


def _tuple_value(config, key: str, value):
  """A value for a tuple field (mesh.shape) from its text "(a,b,c)", each element of the
  type of the config's; other fields' values as they are."""
  if config_path.get_type(key, config) is not tuple or isinstance(value, tuple):
    return value
  default, text = config_path.get_value(key, config), str(value).strip()
  kinds = {type(v) for v in default}
  kind = kinds.pop() if len(kinds) == 1 else None  # the elements' type, if they share one
  items = [sweep_values.scalar(v) for v in sweep_values.split(text[1:-1]) if v.strip()]
  if kind is float:
    items = [float(v) if type(v) is int else v for v in items]
  if text[:1] + text[-1:] != "()" or (kind and not all(type(v) is kind for v in items)):
    raise ValueError(f"sweep value {text!r} for {key} is not a tuple like the config's "
                     f"{format_value(default)}: write each in parentheses, e.g. "
                     f"{key}={format_value(default)}")
  return tuple(items)


def pruned_budgets(config) -> list[float]:
  """Budgets of a scaling sweep that expand() drops for repeating the data too often."""
  sweep = config.sweep
  if sweep.kind != "scaling" or not sweep.budgets or not sweep.get("dataset_tokens", 0):
    return []
  kept = {r["budget"] for r in expand(config)}
  return [b for b in sweep_values.numbers(sweep.budgets, "budgets") if b not in kept]


KINDS = {"grid": _grid, "random": _random, "scaling": scaling_grid.expand}


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
      _parsed_value(config, key, value)  # ... or on a value of the wrong type
  return runs


# The parsers ml_collections gives a --config.KEY=VALUE flag, by the type of the field.
_PARSERS = {float: absl_flags.FloatParser(), bool: absl_flags.BooleanParser(),
            int: absl_flags.IntegerParser(), str: absl_flags.ArgumentParser(),
            tuple: tuple_parser.TupleParser()}


def _parsed_value(config, key: str, value):
  """A swept value as the run's --config.KEY flag sets it; refused if the flag would not
  parse it, before any run is launched (each would fail on it after the launcher made its
  folder)."""
  kind = config_path.get_type(key, config)
  parser = _PARSERS.get(kind)
  if parser is None or config_path.get_value(key, config) is None:
    return value  # a field without a type (None) takes any literal
  try:
    return parser.parse(format_value(value))
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


def with_sweep_flag(config, axes: str, trials: int | None, seed: int | None = None):
  """`config` with its sweep set from --sweep/--trials/--sweep_seed (added if the config has
  none: a config without a sweep block has no sweep.seed to override, so without --sweep_seed
  every random search of it would draw the same trials)."""
  if seed is not None and not trials:
    raise ValueError("--sweep_seed seeds a random search: give --trials and --sweep too")
  if trials is not None and trials < 1:  # else a random search of no runs
    raise ValueError(f"--trials must be at least 1 (the random search's draws), got {trials};"
                     f" leave it out for a grid")
  if not axes:
    if trials:
      raise ValueError("--trials needs --sweep with the random-search axes")
    return config
  with config.unlocked():
    if "sweep" not in config:
      config.sweep = default_config()
  config.sweep.update(kind="random" if trials else "grid", axes=axes,
                      trials=trials or config.sweep.trials)
  if seed is not None:
    config.sweep.seed = seed
  return config


def passthrough_flags(config_flag) -> list[str]:
  """The launcher's own --config.KEY=VALUE overrides, for every run (not the sweep's keys)."""
  overrides = config_flags.get_override_values(config_flag)
  return [f"--config.{k}={format_value(v)}" for k, v in overrides.items()
          if not k.startswith("sweep.")]


def plan(config, workdir: str, *, config_arg: str, python: str = "python",
         module: str = "transformer.train", extra_flags=(), launcher=(),
         write: bool = True) -> list[dict]:
  """expand(config) with each run's argv under `command`; writes DIR/sweep.json (with
  write=False, a dry run, it only checks that DIR holds no other sweep and writes nothing)."""
  if os.path.exists(os.path.join(workdir, "results.json")):
    raise ValueError(f"{workdir} holds an experiment's results (results.json), whose "
                     f"results.md a sweep would overwrite; use a new --workdir")
  runs = expand(config)
  check_passthrough(config, runs, extra_flags)
  if module == "transformer.train":
    check_finished_configs(workdir, check_run_configs(config, runs))
  for r in runs:
    r["command"] = train_command(python, module, config_arg, os.path.join(workdir, r["name"]),
                                 r["overrides"], extra_flags)
  if write:
    write_sweep_json(workdir, config, runs, list(launcher))
  else:
    earlier_runs(workdir, runs)
  return runs


def check_passthrough(config, runs: list[dict], extra_flags) -> None:
  """Refuse a launcher's --config.KEY flag for a key the sweep sets in each run: the run's own
  flag comes after it on the command line and wins, so it would be silently ignored."""
  swept = {k for r in runs for k in r["overrides"]}
  if config.sweep.kind == "scaling":
    swept -= scaling_grid.config_capped(config.sweep)
  for flag in extra_flags:
    key = flag.removeprefix("--config.").partition("=")[0]
    if key in swept:
      raise ValueError(f"--config.{key} would be ignored: the sweep sets {key} in every run; "
                       f"drop the flag, or take {key} off the sweep")


def check_run_configs(config, runs: list[dict]) -> dict[str, dict]:
  """The train command's own config checks on every run, before any is launched: a value
  that is the right type but wrong for the model (num_heads not dividing d_model) would
  otherwise fail only when its run starts, after the runs before it have trained. Returns
  each run's flat config by name."""
  # Deferred: the checks import the model and data layers, which only a launch needs.
  from transformer.training.config_checks import check_config
  planned = {}
  for r in runs:
    run_config = config.copy_and_resolve_references()
    with run_config.unlocked():
      for key, value in r["overrides"].items():
        config_path.set_value(key, run_config, _parsed_value(config, key, value))
    try:
      check_config(run_config)
    except ValueError as e:
      raise ValueError(f"run {r['name']}: {e}") from None
    planned[r["name"]] = schema.flatten(run_config.to_dict())
  return planned


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
  earlier = earlier_runs(workdir, runs)
  if earlier is not None:
    if [_run_identity(r) for r in earlier] != [_run_identity(r) for r in runs]:
      n = 1
      while os.path.exists(os.path.join(workdir, f"sweep.{n}.json")):
        n += 1
      os.replace(path, os.path.join(workdir, f"sweep.{n}.json"))
  atomic_write(path, json.dumps(record, indent=2))
  return path


def earlier_runs(workdir: str, runs: list[dict]) -> list[dict] | None:
  """The runs of DIR's sweep.json (None without one), refusing a plan that drops or changes
  one of them that has started (check_same_sweep)."""
  path = os.path.join(workdir, "sweep.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    earlier = json.load(f)["runs"]
  check_same_sweep(workdir, earlier, runs)
  return earlier


def _run_identity(run: dict) -> tuple:
  # A run is its name and its training command, less the interpreter (another venv) and
  # the run directory (the same DIR given relative or absolute), its flags in any order (each
  # key is set once: the same --config.* overrides typed in another order are the same run).
  return run["name"], tuple(sorted(a for a in run["command"][1:]
                                   if not a.startswith("--workdir=")))


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
