r"""Per-run records: every evaluation of a trained run cached in its directory, and a copy of
those small files that can be committed, so that a sweep that outlives its machine resumes on
another one without the checkpoints.

A run directory (DIR/runs/<scheme>/seed<k>) holds the checkpoints (megabytes each) and a few
small JSON files: summary.json and config.json (what trained, and that it finished),
criterion.json (the retrieval models' checks) and one file per evaluation, each a dict keyed
by everything that determines its numbers (the evaluation's settings and the trained run). A
run whose summary and evaluations are all there is never loaded: the experiments read the
cache, skip the training and go on. So the JSON files are the run, as far as the results go.

  python -m experiments.records save RUNS DEST     # RUNS' records -> DEST (to commit)
  python -m experiments.records restore DEST RUNS  # DEST's records -> RUNS (a new machine)
  python -m experiments.records stash RUNS DEST GLOB...  # in-flight checkpoints -> DEST

save copies every record of RUNS that DEST lacks or holds in another version; restore copies
only what RUNS lacks (a run directory's own files are newer than any copy of them), so neither
ever loses what the other holds. save refuses a DEST that holds runs with checkpoints: that is
RUNS, the arguments swapped.

A chain of runs, each started from the last one's parameters (train.init_from: the retrieval
curriculum's warm-ups), outlives its machine only with a checkpoint: stash keeps, for each GLOB
(a chain's run directories, relative to RUNS), the newest checkpoint among them in
DEST/in_flight, which is all the chain needs to go on (an unfinished run resumes from its own
checkpoint and never reads init_from again; the next run starts from the last finished one).
DEST/in_flight holds only what the last stash named, and restore puts it back where RUNS has
no checkpoint of that run.
"""

import glob
import json
import os
import re
import shutil
import sys

# The small files of a finished run's directory (one with a summary.json) that carry its
# results: the scaling fits read metrics.jsonl too. Anything else (checkpoints, TensorBoard
# events, the tokenizer) stays with the machine, and so does every file of an unfinished run,
# which restarts from its checkpoint or, on another machine, from scratch. A sweep's own
# sweep.json (its design) is kept wherever it is.
IN_FLIGHT = "in_flight"
STASH_DIRS = (IN_FLIGHT, IN_FLIGHT + ".tmp", IN_FLIGHT + ".old")  # the stash, being replaced
RECORD_FILES = ("summary.json", "config.json", "metrics.jsonl", "criterion.json",
                "extrapolation_eval.json", "probes_eval.json")
SWEEP_FILES = ("sweep.json",)


def _is_sweep_file(name: str) -> bool:
  """sweep.json, or an earlier record of the sweep the launcher kept when a grid was
  extended (sweep.1.json, sweep.2.json, ...)."""
  return name in SWEEP_FILES or re.fullmatch(r"sweep\.\d+\.json", name) is not None


def cached(run_dir: str, key: dict, compute, name: str = "probes_eval.json"):
  """compute() once per key: the result is kept in run_dir/name under json.dumps(key) and
  returned from there afterwards (entries of other keys are kept, never reused)."""
  path = os.path.join(run_dir, name)
  cache = {}
  if os.path.exists(path):
    with open(path) as f:
      cache = json.load(f)
  text = json.dumps(key, sort_keys=True)
  if text not in cache:
    # Through JSON, so a fresh result reads exactly as a cached one (string keys).
    cache[text] = json.loads(json.dumps(compute()))
    with open(path + ".tmp", "w") as f:
      json.dump(cache, f)
    os.replace(path + ".tmp", path)  # a kill mid-write leaves the old cache whole
  return cache[text]


def load(run_dir: str, step: int | None = None):
  """checkpoint.load_for_inference, with a one-line error for a run restored from its
  records (summary, no checkpoints) that is asked for an evaluation its records lack."""
  from transformer.training import checkpoint  # noqa: PLC0415 (save/restore need no jax)
  if (os.path.exists(os.path.join(run_dir, "summary.json"))
      and not os.path.isdir(os.path.join(run_dir, "checkpoints"))):
    raise FileNotFoundError(
        f"{run_dir} holds only its records, not its checkpoints, and they lack an evaluation "
        f"this config asks for; move the run directory away (with the runs it started from, "
        f"e.g. its _warm* warm-ups, when their checkpoints are gone too) to train it again")
  return checkpoint.load_for_inference(run_dir, step)


def run_key(summary: dict) -> dict:
  """What identifies a trained run in a cache key: its final step, eval loss and wall time,
  so a run trained again in the same directory never matches its predecessor's entries."""
  return {k: summary.get(k) for k in ("step", "final_eval_loss", "wall_time_s")}


def _records(root: str):
  """Paths (relative to root) of every record file under root."""
  for here, dirs, files in os.walk(root):
    # The stash (in_flight/) is stash's and unstash's alone: copied as records it would come
    # back on the next save over a newer stash's files.
    dirs[:] = sorted(d for d in dirs if d != "checkpoints"
                     and not (here == root and d in STASH_DIRS))
    finished = "summary.json" in files
    for name in sorted(files):
      if (finished and name in RECORD_FILES) or _is_sweep_file(name):
        yield os.path.relpath(os.path.join(here, name), root)


def _same(a: str, b: str) -> bool:
  with open(a, "rb") as fa, open(b, "rb") as fb:
    return fa.read() == fb.read()


def _live_run(root: str) -> str | None:
  """A run directory under root that has checkpoints (outside the stash), or None."""
  for here, dirs, _ in os.walk(root):
    if "checkpoints" in dirs:
      return here
    dirs[:] = sorted(d for d in dirs if not (here == root and d in STASH_DIRS))
  return None


def copy(src: str, dest: str, overwrite: bool) -> list[str]:
  """Copy src's record files into dest (same relative paths); an existing file in dest is
  replaced only when `overwrite`. Returns what was copied.

  Overwriting into a dest that holds live runs (checkpoints) is refused: that is `save` with
  its arguments swapped, which would put the committed copies over the runs' newer files."""
  if not os.path.isdir(src):
    raise ValueError(f"{src} is not a directory of runs; give the --workdir root the "
                     f"experiments ran in (it holds runs/<scheme>/seed<k>)")
  live = _live_run(dest) if overwrite else None
  if live is not None:
    raise ValueError(f"{dest} holds runs with checkpoints ({live}), so it is RUNS, not DEST: "
                     f"save RUNS DEST copies RUNS' records into DEST; did you mean `save {dest} "
                     f"{src}`, or `restore {src} {dest}`? (nothing was copied)")
  inside = _nested(src, dest)
  if inside:
    raise ValueError(f"{inside}; give directories side by side (nothing was copied)")
  rels = list(_records(src))
  if overwrite:  # every sweep first, so that a refusal copies nothing
    for rel in rels:
      if os.path.basename(rel) == "sweep.json":
        _check_same_sweep(os.path.join(src, rel), os.path.join(dest, rel))
  copied = []
  for rel in rels:
    target = os.path.join(dest, rel)
    if os.path.exists(target) and (not overwrite or _same(os.path.join(src, rel), target)):
      continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(os.path.join(src, rel), target + ".tmp")
    os.replace(target + ".tmp", target)
    copied.append(rel)
  return copied


def _nested(src: str, dest: str) -> str | None:
  """Why src and dest may not be used together (one inside the other: every save would copy
  the records into themselves again), or None."""
  a, b = os.path.realpath(src), os.path.realpath(dest)
  if a == b:
    return f"{src} and {dest} are the same directory"
  common = os.path.commonpath([a, b])
  if common in (a, b):
    inner, outer = (dest, src) if common == a else (src, dest)
    return f"{inner} lies inside {outer}"
  return None


def _check_same_sweep(new: str, old: str) -> None:
  """Refuse to save a sweep.json over a recorded one of another sweep: one that drops or
  changes a run recorded there (an extended grid, which keeps every run, is the same sweep)."""
  if not os.path.exists(old) or _same(new, old):
    return
  from launch import sweep  # noqa: PLC0415 (the launcher owns what makes a run the same)
  try:
    with open(new) as f_new, open(old) as f_old:
      runs, earlier = json.load(f_new)["runs"], json.load(f_old)["runs"]
  except (ValueError, KeyError, TypeError):
    return  # not a launcher's record on one side: nothing to compare, copied as before
  try:
    sweep.check_same_sweep(os.path.dirname(old), earlier, runs)
  except ValueError as e:
    why = str(e).split(": ", 1)[-1].split(" (see")[0]
    raise ValueError(f"{old} records another sweep than {new} ({why}); save it into a new "
                     f"DEST (nothing was copied)") from None


def _latest_checkpoint(run_dir: str) -> str | None:
  """run_dir/checkpoints/<step> of the highest step that finished writing, or None."""
  root = os.path.join(run_dir, "checkpoints")
  steps = [int(d) for d in os.listdir(root) if d.isdigit()] if os.path.isdir(root) else []
  steps = [s for s in steps
           if os.path.exists(os.path.join(root, str(s), "commit_success.txt"))]
  return os.path.join(root, str(max(steps))) if steps else None


def stash(runs: str, dest: str, globs: list[str]) -> list[str]:
  """The newest checkpoint of each chain (a glob of run directories under runs) ->
  dest/in_flight/<run>/checkpoints/<step>, replacing dest/in_flight. Returns what it holds."""
  chosen = []
  for pattern in globs:
    found = [c for c in map(_latest_checkpoint, sorted(glob.glob(os.path.join(runs, pattern))))
             if c]
    if not found:
      raise ValueError(f"{pattern}: no run directory under {runs} matches it with a "
                       f"checkpoint; name a chain's run directories relative to RUNS")
    chosen.append(max(found, key=lambda c: os.path.getmtime(os.path.join(c, "commit_success.txt"))))
  target = os.path.join(dest, IN_FLIGHT)
  staging, earlier = target + ".tmp", target + ".old"
  _recover_stash(dest)
  shutil.rmtree(staging, ignore_errors=True)
  for checkpoint in chosen:
    shutil.copytree(checkpoint, os.path.join(staging, os.path.relpath(checkpoint, runs)))
    run = os.path.dirname(os.path.dirname(checkpoint))  # its small files too: an unfinished
    for name in RECORD_FILES:                           # run's metrics have no record yet
      if os.path.exists(os.path.join(run, name)):
        shutil.copy2(os.path.join(run, name),
                     os.path.join(staging, os.path.relpath(run, runs), name))
  # The previous stash goes only once this one is whole and in place: a kill between the two
  # renames leaves it as in_flight.old, which the next stash or restore puts back.
  if os.path.exists(target):
    os.replace(target, earlier)
  os.replace(staging, target)
  shutil.rmtree(earlier, ignore_errors=True)
  return [os.path.relpath(c, runs) for c in chosen]


def _recover_stash(dest: str) -> None:
  """A stash killed between its renames left only DEST/in_flight.old: put it back."""
  target = os.path.join(dest, IN_FLIGHT)
  if not os.path.exists(target) and os.path.isdir(target + ".old"):
    os.replace(target + ".old", target)


def unstash(dest: str, runs: str) -> list[str]:
  """dest/in_flight's checkpoints -> runs, for each run that has no checkpoint of its own, with
  the run's small files that runs lacks."""
  _recover_stash(dest)
  source = os.path.join(dest, IN_FLIGHT)
  restored = []
  for here, dirs, files in os.walk(source):
    if "checkpoints" not in dirs:
      continue
    dirs[:] = []
    run = os.path.relpath(here, source)
    if _latest_checkpoint(os.path.join(runs, run)) is not None:
      continue
    shutil.copytree(os.path.join(here, "checkpoints"), os.path.join(runs, run, "checkpoints"),
                    dirs_exist_ok=True)
    for name in files:
      if not os.path.exists(os.path.join(runs, run, name)):
        shutil.copy2(os.path.join(here, name), os.path.join(runs, run, name))
    restored += [os.path.join(run, "checkpoints", step)
                 for step in os.listdir(os.path.join(here, "checkpoints"))]
  return sorted(restored)


def main(argv) -> None:
  usage = ("usage: python -m experiments.records save RUNS DEST | restore DEST RUNS | "
           "stash RUNS DEST GLOB...")
  if len(argv) < 4 or argv[1] not in ("save", "restore", "stash") or (
      argv[1] != "stash" and len(argv) != 4) or (argv[1] == "stash" and len(argv) < 5):
    sys.exit(usage)
  try:
    if os.path.exists(argv[3]) and not os.path.isdir(argv[3]):
      raise ValueError(f"{argv[3]} is a file; give a directory")
    if argv[1] == "stash":
      held = stash(argv[2], argv[3], argv[4:])
      print(f"stash: {os.path.join(argv[3], IN_FLIGHT)} holds " + ", ".join(held))
      return
    copied = copy(argv[2], argv[3], overwrite=argv[1] == "save")
    restored = unstash(argv[2], argv[3]) if argv[1] == "restore" else []
  except (ValueError, OSError) as e:  # OSError: a path through a file, no permission
    sys.exit(f"error: {e}")
  print(f"{argv[1]}: {len(copied)} record files {argv[2]} -> {argv[3]}"
        + (f"; checkpoints {', '.join(restored)}" if restored else ""))


if __name__ == "__main__":
  main(sys.argv)
