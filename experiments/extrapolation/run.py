r"""Position extrapolation: train one decoder per positional scheme at length L, evaluate at
L, 2L, 4L, 8L and 16L (non-overlapping windows and a sliding window), write results.json,
results.md and plots.

  python -m experiments.extrapolation.run --config configs/extrapolation.py --workdir DIR

Resumable: each scheme trains in DIR/runs/<scheme> (a finished run is skipped if it was
trained with this config and refused otherwise, an interrupted one resumes from its
checkpoint) and each evaluation is cached in that run's extrapolation_eval.json, keyed by
everything that determines its numbers. RoPE's context-extension scalings (position
interpolation, YaRN) are applied to the trained RoPE model at evaluation only, with
factor = eval length / L.
"""

import ast
import json
import os
import sys
import time

import ml_collections
import numpy as np
from absl import flags, logging

from experiments import records
from experiments import results as experiment_results
from experiments.extrapolation import plots
from transformer import cli, data, schema
from transformer.model import positions
from transformer.training import checkpoint, loop
from transformer.data import featurize as data_objectives
from transformer.data import sources
from transformer.inference.scoring import Scorer

# --config and --workdir are the train command's flags: the same config file format, here
# with an `experiment` block, and the results directory.
cli.define_train_flags()
FLAGS = flags.FLAGS

EXPERIMENT = "experiments.extrapolation.run"  # recorded in results.json: who wrote it

# Evaluation-only variants of a trained scheme: name -> (trained scheme, rope scaling).
EVAL_VARIANTS = {"rope+pi": ("rope", "linear"), "rope+yarn": ("rope", "yarn")}

# A finished run is reused when its config differs from this one only in
# checkpoint.BOOKKEEPING_KEYS (logging, checkpoint cadence, layout, data location). Every
# other key, train.steps included, must match, or the skipped run would stand in for a model
# this config never trained.
BOOKKEEPING_KEYS = checkpoint.BOOKKEEPING_KEYS


# Experiment scheme names that are not positions.SCHEMES names: name -> the position scheme
# it trains. A name's other settings are experiment.overrides.<name> (configs/extrapolation.py:
# "sinusoidal" scales the token embeddings by sqrt(d_model) as Vaswani et al. did, and
# "sinusoidal_unscaled" keeps the earlier setting as an ablation).
SCHEME_POSITIONS = {"sinusoidal_unscaled": "sinusoidal"}


def position_of(scheme: str) -> str:
  return SCHEME_POSITIONS.get(scheme, scheme)


def parse_overrides(text: str, where: str) -> list[tuple[str, object]]:
  """"opt.lr=3e-4;train.steps=3000" -> [("opt.lr", 3e-4), ("train.steps", 3000)]."""
  out = []
  for part in (p.strip() for p in str(text or "").split(";")):
    if not part:
      continue
    key, eq, value = part.partition("=")
    if not eq or not key.strip():
      raise ValueError(f"{where}={text!r}: write key=value pairs separated by ';', "
                       f"e.g. 'opt.lr=3e-4;train.steps=3000'")
    try:
      value = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      value = value.strip()
    out.append((key.strip(), value))
  return out


def _overrides(config, scheme: str) -> str:
  table = config.experiment.get("overrides")
  return (table.get(scheme, "") if table is not None else "") or ""


def seeds_of(config, key: str = "seeds") -> list[int]:
  text = str(config.experiment.get(key, "0"))
  try:
    out = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    out = []
  if not out or len(set(out)) != len(out):
    raise ValueError(f"experiment.{key}={text!r}: use distinct integers separated by commas, "
                     f"e.g. '0,1,2'")
  return out


def run_dir_of(workdir: str, scheme: str, seed: int) -> str:
  return os.path.join(workdir, "runs", scheme, f"seed{seed}")


def scheme_config(config: ml_collections.ConfigDict, scheme: str,
                  seed: int | None = None) -> ml_collections.ConfigDict:
  """The training config of one scheme (and seed): the base config without the experiment
  block, with the scheme's position, max_len and experiment.overrides.<scheme> applied."""
  base = ml_collections.ConfigDict(config.to_dict())
  del base["experiment"]
  base.model.position.name = position_of(scheme)
  longest = config.data.seq_len * max(_multipliers(config))
  # A learned table covers exactly the training length: nothing past it was ever trained.
  base.model.max_len = config.data.seq_len if scheme == "learned" else longest
  where = f"experiment.overrides.{scheme}"
  for key, value in parse_overrides(_overrides(config, scheme), where):
    *path, leaf = key.split(".")
    node = base
    try:
      for name in path:
        node = node[name]
      if leaf not in node:
        raise KeyError(leaf)
      node[leaf] = value
    except (KeyError, TypeError) as e:
      raise ValueError(f"{where}: cannot set {key}={value!r} ({e})") from None
  if seed is not None:
    base.train.seed = seed
  return base


def check_schemes(config, schemes, key: str = "experiment.schemes") -> None:
  """Every mistake in the schemes' training configs that shows without compute, before the
  first of possibly hours of training."""
  if not schemes:
    raise ValueError(f"{key} is empty; name at least one of {sorted(positions.SCHEMES)}")
  seeds_of(config)
  for scheme in schemes:
    if position_of(scheme) not in positions.SCHEMES:
      raise ValueError(f"unknown scheme {scheme!r} in {key}; valid: "
                       f"{sorted(set(positions.SCHEMES) | set(SCHEME_POSITIONS))}"
                       + (f" ({', '.join(EVAL_VARIANTS)} are evaluated with rope)"
                          if scheme in EVAL_VARIANTS else ""))
    loop.check_config(scheme_config(config, scheme))


def check_finished_run(config, run_dir: str, summary: dict) -> None:
  """Refuse a finished run that was trained with another config than `config`: skipping it
  would report its model as this config's. Training itself refuses only an incompatible
  checkpoint of an unfinished run."""
  saved = summary.get("config")
  if saved is None:  # summaries from before they held the config: the run's config.json
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
      return
    with open(path) as f:
      saved = schema.flatten(json.load(f))
  now = schema.flatten(config.to_dict())
  # JSON has no tuples; keys only one side has were added or removed since (the default of
  # an added key keeps the old behaviour), so only keys both sides have are compared.
  def as_json(key, value):
    if key == "train.init_from" and value:
      # The run it started from, wherever its workdir lies now (records restored on another
      # machine, experiments/records.py): runs/<scheme>/seed<k>.
      return "/".join(os.path.normpath(value).split(os.sep)[-3:])
    return json.loads(json.dumps(value))
  differing = [k for k in sorted(set(saved) & set(now))
               if k not in BOOKKEEPING_KEYS and as_json(k, saved[k]) != as_json(k, now[k])]
  if differing:
    raise ValueError(
        f"{run_dir} is a finished run of another config ("
        + ", ".join(f"{k}: {saved[k]!r} there vs {now[k]!r} now" for k in differing[:4])
        + (", ..." if len(differing) > 4 else "") + "); use a new --workdir")


def train_schemes(config, workdir: str, schemes) -> dict:
  """Train (or resume, or skip when finished with this config) one run per scheme and seed
  (experiment.seeds) in workdir/runs/<scheme>/seed<k>; returns {scheme: {seed: summary}}.
  Check the schemes (check_schemes) first."""
  seeds = seeds_of(config)
  runs = [(scheme, seed) for seed in seeds for scheme in schemes]  # every scheme's seed 0 first
  # Every finished run is checked before anything trains, so a refusal costs nothing.
  for scheme, seed in runs:
    run_dir = run_dir_of(workdir, scheme, seed)
    summary_path = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary_path):
      with open(summary_path) as f:
        check_finished_run(scheme_config(config, scheme, seed), run_dir, json.load(f))
  summaries = {}
  for scheme, seed in runs:
    run_dir = run_dir_of(workdir, scheme, seed)
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(summary_path):
      print(f"== training {scheme} seed {seed} in {run_dir}", flush=True)
      loop.train_and_evaluate(scheme_config(config, scheme, seed), run_dir)
      if not os.path.exists(summary_path):  # stopped by a signal; its checkpoint is saved
        sys.exit(f"training {scheme} seed {seed} stopped before the end; re-run the same "
                 f"command to resume")
    with open(summary_path) as f:
      summaries.setdefault(scheme, {})[seed] = json.load(f)
  return summaries


def _multipliers(config):
  text = str(config.experiment.eval_multipliers)
  try:
    out = [int(m) for m in text.split(",")]
  except ValueError:
    out = []
  if not out or min(out) < 1:
    raise ValueError(f"experiment.eval_multipliers={text!r}: use positive integers separated "
                     f"by commas, e.g. '1,2,4'")
  return out


def token_stream(data_config, tokenizer, split: str, num_tokens: int):
  """(inputs, targets) of a split's documents concatenated, exactly as cross-document
  training rows hold them: each document contributes BOS + tokens as inputs and
  tokens + EOS as targets."""
  inputs, targets, _ = _stream(data_config, tokenizer, split, num_tokens)
  return inputs, targets


def _stream(data_config, tokenizer, split, num_tokens):
  records = sources.load(data_config, split)
  inputs, targets, total, words = [], [], 0, 0
  for i in range(len(records)):
    tokens, _ = data_objectives.lm_tokens(records[i], tokenizer)
    inputs.append(tokens[:-1])
    targets.append(tokens[1:])
    total += len(tokens) - 1
    words += len(str(records[i].get("text", "")).split())
    if total >= num_tokens:
      return (np.concatenate(inputs)[:num_tokens], np.concatenate(targets)[:num_tokens],
              {"tokens": total, "words": words})
  raise ValueError(f"split {split!r} of {data_config.name!r} has only {total} tokens; "
                   f"need {num_tokens} (lower experiment.eval_tokens)")


def stream_statistics(data_config, tokenizer, split: str, num_tokens: int) -> dict:
  """Tokens per whitespace-separated word of the evaluated documents (the factor that turns
  nats/token into nats/word, for comparing with word-level perplexities such as Press et
  al.'s on WikiText-103), and the unigram entropy of the evaluated targets (nats/token: the
  loss of a model that learned only token frequencies)."""
  _, targets, counts = _stream(data_config, tokenizer, split, num_tokens)
  freq = np.bincount(targets)
  p = freq[freq > 0] / freq.sum()
  return {"tokens_per_word": counts["tokens"] / max(counts["words"], 1),
          "unigram_entropy": float(-(p * np.log(p)).sum())}


def evaluate_length(scorer: Scorer, stream, length: int, stride: int, batch_size: int):
  """Next-token losses with (a) non-overlapping windows of `length` tokens and (b) a
  sliding window that advances by `stride`, scoring only the last `stride` targets of each
  window (so every scored token sees at least length - stride tokens of context, as in
  Press et al. 2022). Returns the mean loss of each non-overlapping window, of each sliding
  window's scored part, and the non-overlapping windows' loss by position."""
  inputs, targets = stream

  def losses_of(starts):  # [len(starts), length]; batches padded to one compiled shape
    out = []
    for i in range(0, len(starts), batch_size):
      chunk = list(starts[i:i + batch_size])
      padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
      nll = scorer.token_losses(np.stack([inputs[b:b + length] for b in padded]),
                                targets_BL=np.stack([targets[b:b + length] for b in padded]))[0]
      out.append(nll[:len(chunk)])
    return np.concatenate(out)

  nll = losses_of(range(0, len(inputs) - length + 1, length))
  sliding = losses_of(range(0, len(inputs) - length + 1, stride))[:, -stride:]
  return nll.mean(axis=1), sliding.mean(axis=1), nll.mean(axis=0)


# Bumped when an evaluation's stored form changes, so older cache entries are not reused.
EVAL_VERSION = 2


def eval_cache_key(config, variant: str, summary: dict) -> str:
  """What determines one evaluation's numbers, as the key of its cache entry: the variant,
  the evaluation settings and lengths, and the trained run (its final step, eval loss and
  wall time, so a run trained again in the same directory never matches its
  predecessor's entries)."""
  exp = config.experiment
  key = {"variant": variant, "eval_split": exp.eval_split, "eval_tokens": exp.eval_tokens,
         "eval_lengths": [config.data.seq_len * m for m in _multipliers(config)],
         "sliding_stride_fraction": exp.sliding_stride_fraction,
         "eval_batch_size": exp.eval_batch_size, "version": EVAL_VERSION,
         "run": records.run_key(summary)}
  return json.dumps(key, sort_keys=True)


def evaluate_run(config, run_dir: str, variant: str, stream: np.ndarray,
                 summary: dict) -> dict:
  """Losses of one trained run at every evaluation length, per evaluation window (cached in
  the run directory; entries of other settings are kept but never reused)."""
  cache_path = os.path.join(run_dir, "extrapolation_eval.json")
  cache = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      cache = json.load(f)
  key = eval_cache_key(config, variant, summary)
  if key in cache:
    return cache[key]
  _, model_config, params, _ = records.load(run_dir)
  train_length = config.data.seq_len
  exp = config.experiment
  out = {"windows": {}, "windows_sliding": {}, "per_position": None}
  for m in _multipliers(config):
    length = train_length * m
    if length > model_config.max_len:
      out["windows"][length] = out["windows_sliding"][length] = None  # not applicable
      continue
    cfg = ml_collections.ConfigDict(model_config.to_dict())
    if variant in EVAL_VARIANTS and m > 1:
      cfg.position.scaling = EVAL_VARIANTS[variant][1]
      cfg.position.scaling_factor = float(m)
      cfg.position.original_max_len = train_length
    stride = max(1, int(length * exp.sliding_stride_fraction))
    windows, sliding, by_position = evaluate_length(Scorer(cfg, params), stream, length,
                                                    stride, exp.eval_batch_size)
    out["windows"][length] = windows.round(5).tolist()
    out["windows_sliding"][length] = sliding.round(5).tolist()
    out["per_position"] = by_position.tolist()  # the longest applicable length wins
    print(f"  {variant:10s} {os.path.basename(run_dir)} length {length:6d}: loss "
          f"{windows.mean():.4f}, sliding {sliding.mean():.4f}", flush=True)
  cache[key] = out
  with open(cache_path + ".tmp", "w") as f:
    json.dump(cache, f)
  os.replace(cache_path + ".tmp", cache_path)  # a kill mid-write leaves the old cache whole
  return out


def bootstrap_interval(windows_SW, num_samples: int = 2000, seed: int = 0) -> list[float]:
  """95% percentile-bootstrap interval of the mean loss over evaluation windows: windows are
  resampled (the same resample for every seed, as the seeds saw the same windows) and the
  statistic is the mean over seeds and resampled windows."""
  per_window = np.asarray(windows_SW, np.float64).mean(axis=0)  # seed-mean of each window
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(per_window), size=(num_samples, len(per_window)))
  means = per_window[idx].mean(axis=1)
  return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def aggregate(per_seed: dict) -> dict:
  """{seed: window losses or None} -> mean and sd over seeds (of each seed's mean loss),
  the bootstrap interval over windows, the seeds; None where not applicable."""
  values = [v for v in per_seed.values() if v is not None]
  if not values:
    return None
  means = np.array([np.mean(v) for v in values])
  return {"mean": float(means.mean()), "sd": float(means.std(ddof=1)) if len(means) > 1 else 0.0,
          "ci95_windows": bootstrap_interval(values), "seeds": len(values),
          "windows": len(values[0]), "per_seed": means.round(5).tolist()}


def main(argv):
  del argv
  run(cli.config(FLAGS["config"]), cli.directory(FLAGS.workdir))


def run(config, workdir: str) -> None:
  loop.configure_host(**cli.host_settings())
  logging.set_verbosity(logging.ERROR)  # checkpoint libraries log every save at INFO
  start = time.time()
  exp = config.experiment
  schemes = [s for s in str(exp.schemes).split(",") if s]
  train_length = config.data.seq_len
  check_schemes(config, schemes)
  experiment_results.check_workdir(workdir, EXPERIMENT)

  # The evaluation stream needs the tokenizer, which sentencepiece trains with the first run;
  # any other is at hand now, so a split too short for eval_tokens fails before training.
  first_run = run_dir_of(workdir, schemes[0], seeds_of(config)[0])
  tokenizer_dir = checkpoint.tokenizer_dir(first_run)
  stream = None
  if config.data.tokenizer != "sentencepiece" or os.path.isdir(tokenizer_dir):
    stream = token_stream(config.data, data.get_tokenizer(config.data, tokenizer_dir),
                          exp.eval_split, exp.eval_tokens)
  os.makedirs(workdir, exist_ok=True)

  summaries = train_schemes(config, workdir, schemes)

  tokenizer = data.get_tokenizer(config.data, tokenizer_dir)
  if stream is None:
    stream = token_stream(config.data, tokenizer, exp.eval_split, exp.eval_tokens)
  results = {"train_length": train_length, "eval_lengths": [train_length * m for m in
                                                            _multipliers(config)],
             "seeds": seeds_of(config), "loss": {}, "loss_sliding": {}, "per_position": {},
             "not_applicable": {}}
  results.update(stream_statistics(config.data, tokenizer, exp.eval_split, exp.eval_tokens))
  variants = schemes + [v for v, (base, _) in EVAL_VARIANTS.items() if base in schemes]
  for variant in variants:
    base = EVAL_VARIANTS.get(variant, (variant,))[0]
    print(f"== evaluating {variant}", flush=True)
    outs = {seed: evaluate_run(config, run_dir_of(workdir, base, seed), variant, stream,
                               summary) for seed, summary in summaries[base].items()}
    lengths = results["eval_lengths"]
    for key, field in (("loss", "windows"), ("loss_sliding", "windows_sliding")):
      results[key][variant] = {n: aggregate({s: o[field].get(str(n), o[field].get(n))
                                             for s, o in outs.items()}) for n in lengths}
    curves = [o["per_position"] for o in outs.values() if o["per_position"] is not None]
    results["per_position"][variant] = (np.mean(curves, 0).tolist() if curves else None)
    results["not_applicable"][variant] = [n for n in lengths
                                          if results["loss"][variant][n] is None]
  # The gap at the training length: how far each scheme is from the best one at L, which
  # every extrapolation number has to be read against (Press et al. compare schemes whose
  # word-level perplexities at L are close; the per-word table gives that unit).
  at_L = {v: row[train_length]["mean"] for v, row in results["loss"].items()
          if row[train_length] is not None}
  best = min(at_L.values())
  results["gap_at_L"] = {v: {"nats": x - best, "relative": (x - best) / best}
                         for v, x in at_L.items()}
  results["train_summaries"] = {
      s: {str(seed): {k: summary.get(k) for k in ("final_eval_loss", "params_total", "tokens",
                                                  "step", "wall_time_s")}
          for seed, summary in by_seed.items()} for s, by_seed in summaries.items()}
  results["tokens_per_parameter"] = {
      s: float(np.mean([x["tokens"] / x["params_total"] for x in by_seed.values()]))
      for s, by_seed in results["train_summaries"].items()}
  results["eval_tokens"] = int(len(stream[0]))
  results["dataset"] = config.data.name
  experiment_results.write(results, workdir, start, plots.write_all, EXPERIMENT)


if __name__ == "__main__":
  cli.run(main, required=("config", "workdir"), verbosity=logging.ERROR)
