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

import json
import os
import sys
import time

import ml_collections
import numpy as np
from absl import app, flags, logging

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

# Keys of a finished run's config that say how it was logged, checkpointed or laid out, not
# what it learned: a re-run that changes only these reuses the run. Every other key must
# match, or the skipped run would stand in for a model this config never trained.
BOOKKEEPING_KEYS = (("train.log_every", "train.eval_every", "train.checkpoint_every",
                     "train.keep_checkpoints", "train.keep_best", "train.async_checkpoint",
                     "train.peak_flops", "mesh.shape")
                    + schema.RELOCATABLE_DATA_KEYS
                    + tuple(f"model.{k}" for k in schema.COMPUTE_KEYS))


def scheme_config(config: ml_collections.ConfigDict, scheme: str) -> ml_collections.ConfigDict:
  """The training config of one scheme: the base config without the experiment block."""
  base = ml_collections.ConfigDict(config.to_dict())
  del base["experiment"]
  base.model.position.name = scheme
  longest = config.data.seq_len * max(_multipliers(config))
  # A learned table covers exactly the training length: nothing past it was ever trained.
  base.model.max_len = config.data.seq_len if scheme == "learned" else longest
  return base


def check_schemes(config, schemes, key: str = "experiment.schemes") -> None:
  """Every mistake in the schemes' training configs that shows without compute, before the
  first of possibly hours of training."""
  if not schemes:
    raise ValueError(f"{key} is empty; name at least one of {sorted(positions.SCHEMES)}")
  for scheme in schemes:
    if scheme not in positions.SCHEMES:
      raise ValueError(f"unknown scheme {scheme!r} in {key}; valid: {sorted(positions.SCHEMES)}"
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
      saved = checkpoint.flatten(json.load(f))
  now = checkpoint.flatten(config.to_dict())
  # JSON has no tuples; keys only one side has were added or removed since (the default of
  # an added key keeps the old behaviour), so only keys both sides have are compared.
  as_json = lambda v: json.loads(json.dumps(v))
  differing = [k for k in sorted(set(saved) & set(now))
               if k not in BOOKKEEPING_KEYS and as_json(saved[k]) != as_json(now[k])]
  if differing:
    raise ValueError(
        f"{run_dir} is a finished run of another config ("
        + ", ".join(f"{k}: {saved[k]!r} there vs {now[k]!r} now" for k in differing[:4])
        + (", ..." if len(differing) > 4 else "") + "); use a new --workdir")


def train_schemes(config, workdir: str, schemes) -> dict:
  """Train (or resume, or skip when finished with this config) one run per scheme in
  workdir/runs/<scheme>; returns each run's summary. Check the schemes (check_schemes)
  first."""
  # Every finished run is checked before anything trains, so a refusal costs nothing.
  for scheme in schemes:
    run_dir = os.path.join(workdir, "runs", scheme)
    summary_path = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary_path):
      with open(summary_path) as f:
        check_finished_run(scheme_config(config, scheme), run_dir, json.load(f))
  summaries = {}
  for scheme in schemes:
    run_dir = os.path.join(workdir, "runs", scheme)
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(summary_path):
      print(f"== training {scheme} in {run_dir}", flush=True)
      loop.train_and_evaluate(scheme_config(config, scheme), run_dir)
      if not os.path.exists(summary_path):  # stopped by a signal; its checkpoint is saved
        sys.exit(f"training {scheme} stopped before the end; re-run the same command to resume")
    with open(summary_path) as f:
      summaries[scheme] = json.load(f)
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
  records = sources.load(data_config, split)
  inputs, targets, total = [], [], 0
  for i in range(len(records)):
    tokens, _ = data_objectives.lm_tokens(records[i], tokenizer)
    inputs.append(tokens[:-1])
    targets.append(tokens[1:])
    total += len(tokens) - 1
    if total >= num_tokens:
      return np.concatenate(inputs)[:num_tokens], np.concatenate(targets)[:num_tokens]
  raise ValueError(f"split {split!r} of {data_config.name!r} has only {total} tokens; "
                   f"need {num_tokens} (lower experiment.eval_tokens)")


def evaluate_length(scorer: Scorer, stream, length: int, stride: int, batch_size: int):
  """Mean next-token loss with (a) non-overlapping windows of `length` tokens and (b) a
  sliding window that advances by `stride`, scoring only the last `stride` targets of each
  window (so every scored token sees at least length - stride tokens of context, as in
  Press et al. 2022). Also the loss by position of the non-overlapping windows."""
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
  return float(nll.mean()), float(sliding.mean()), nll.mean(axis=0)


def eval_cache_key(config, variant: str, summary: dict) -> str:
  """What determines one evaluation's numbers, as the key of its cache entry: the variant,
  the evaluation settings and lengths, and the trained run (its final step, eval loss and
  wall time, so a run trained again in the same directory never matches its
  predecessor's entries)."""
  exp = config.experiment
  key = {"variant": variant, "eval_split": exp.eval_split, "eval_tokens": exp.eval_tokens,
         "eval_lengths": [config.data.seq_len * m for m in _multipliers(config)],
         "sliding_stride_fraction": exp.sliding_stride_fraction,
         "eval_batch_size": exp.eval_batch_size,
         "run": {k: summary.get(k) for k in ("step", "final_eval_loss", "wall_time_s")}}
  return json.dumps(key, sort_keys=True)


def evaluate_run(config, run_dir: str, variant: str, stream: np.ndarray,
                 summary: dict) -> dict:
  """Losses of one trained run at every evaluation length (cached in the run directory;
  entries of other settings, and those of older versions keyed by variant alone, are kept
  but never reused)."""
  cache_path = os.path.join(run_dir, "extrapolation_eval.json")
  cache = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      cache = json.load(f)
  key = eval_cache_key(config, variant, summary)
  if key in cache:
    return cache[key]
  _, model_config, params, _ = checkpoint.load_for_inference(run_dir)
  train_length = config.data.seq_len
  exp = config.experiment
  out = {"loss": {}, "loss_sliding": {}, "per_position": None}
  for m in _multipliers(config):
    length = train_length * m
    if length > model_config.max_len:
      out["loss"][length] = out["loss_sliding"][length] = None  # not applicable
      continue
    cfg = ml_collections.ConfigDict(model_config.to_dict())
    if variant in EVAL_VARIANTS and m > 1:
      cfg.position.scaling = EVAL_VARIANTS[variant][1]
      cfg.position.scaling_factor = float(m)
      cfg.position.original_max_len = train_length
    stride = max(1, int(length * exp.sliding_stride_fraction))
    loss, sliding, by_position = evaluate_length(Scorer(cfg, params), stream, length, stride,
                                                 exp.eval_batch_size)
    out["loss"][length], out["loss_sliding"][length] = loss, sliding
    out["per_position"] = by_position.tolist()  # the longest applicable length wins
    print(f"  {variant:10s} length {length:6d}: loss {loss:.4f}, sliding {sliding:.4f}",
          flush=True)
  cache[key] = out
  with open(cache_path, "w") as f:
    json.dump(cache, f)
  return out


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
  tokenizer_dir = checkpoint.tokenizer_dir(os.path.join(workdir, "runs", schemes[0]))
  stream = None
  if config.data.tokenizer != "sentencepiece" or os.path.isdir(tokenizer_dir):
    stream = token_stream(config.data, data.get_tokenizer(config.data, tokenizer_dir),
                          exp.eval_split, exp.eval_tokens)
  os.makedirs(workdir, exist_ok=True)

  summaries = train_schemes(config, workdir, schemes)

  if stream is None:
    stream = token_stream(config.data, data.get_tokenizer(config.data, tokenizer_dir),
                          exp.eval_split, exp.eval_tokens)
  results = {"train_length": train_length, "eval_lengths": [train_length * m for m in
                                                            _multipliers(config)],
             "loss": {}, "loss_sliding": {}, "per_position": {}, "not_applicable": {}}
  variants = schemes + [v for v, (base, _) in EVAL_VARIANTS.items() if base in schemes]
  for variant in variants:
    base = EVAL_VARIANTS.get(variant, (variant,))[0]
    print(f"== evaluating {variant}", flush=True)
    out = evaluate_run(config, os.path.join(workdir, "runs", base), variant, stream,
                       summaries[base])
    results["loss"][variant] = out["loss"]
    results["loss_sliding"][variant] = out["loss_sliding"]
    results["per_position"][variant] = out["per_position"]
    results["not_applicable"][variant] = [int(k) for k, v in out["loss"].items() if v is None]
  results["perplexity"] = {v: {k: (float(np.exp(x)) if x is not None else None)
                               for k, x in d.items()} for v, d in results["loss"].items()}
  results["train_summaries"] = {s: {k: summaries[s][k] for k in
                                    ("final_eval_loss", "params_total", "tokens", "step",
                                     "wall_time_s")} for s in schemes}
  results["eval_tokens"] = int(len(stream[0]))
  results["dataset"] = config.data.name
  experiment_results.write(results, workdir, start, plots.write_all, EXPERIMENT)

if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
