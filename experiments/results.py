"""Writing an experiment's results: the same record for every experiment."""

import json
import os
import platform
import shlex
import sys
import time

import jax

from launch.sweep_dir import atomic_write

def check_workdir(workdir: str, experiment: str) -> None:
  """Refuse a workdir whose results.json another experiment (or something else) wrote: its
  results.json and results.md would be overwritten with this experiment's. Call it before any
  training, so the refusal costs nothing. A launcher's sweep directory (sweep.json) is refused
  too: its results.md, which may hold the scaling fits, would be overwritten."""
  if os.path.exists(os.path.join(workdir, "sweep.json")):
    raise ValueError(f"{workdir} is a sweep directory (sweep.json), whose results.md this "
                     f"experiment would overwrite; use a new --workdir")
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return
  writer = None
  try:
    with open(path) as f:
      saved = json.load(f)
    writer = saved.get("experiment") or _command_module(saved.get("command", ""))
  except (ValueError, AttributeError, TypeError):
    pass  # not a results.json of ours: refused below like another experiment's
  if writer != experiment:
    raise ValueError(f"{path} was written by {writer or 'something other than an experiment'}"
                     f", not {experiment}; use a new --workdir so it is not overwritten")


def _command_module(command: str) -> str | None:
  """The module of a recorded "python -m MODULE ..." (results.json before "experiment")."""
  try:
    words = shlex.split(command)
  except ValueError:
    return None
  return words[words.index("-m") + 1] if "-m" in words[:-1] else None


def write(results: dict, workdir: str, start: float, write_plots, experiment: str) -> dict:
  """Adds wall time, machine and the writing experiment (`experiment`, its module), writes
  workdir/results.json (keys as a JSON reader sees them: strings) and the experiment's plots
  and table; returns what was written."""
  results["experiment"] = experiment
  results["wall_time_s"] = time.time() - start
  results["machine"] = (f"{platform.machine()} ({cpu_model()}), {os.cpu_count()} cores, "
                        f"jax {jax.__version__} on {jax.default_backend()}")
  results["command"] = shlex.join(["python", "-m", _module_name()] + sys.argv[1:])
  results = json.loads(json.dumps(results))
  # Written whole or not at all: a results.json cut short (a full disk) would lose the last
  # results and make check_workdir refuse the re-run.
  atomic_write(os.path.join(workdir, "results.json"), json.dumps(results, indent=1))
  write_plots(results, workdir)
  print(f"wrote {workdir}/results.json, results.md and plots in {time.time() - start:.0f}s")
  return results


def footer(results: dict) -> str:
  """Markdown lines that tie a table to how it was made."""
  trained = 0.0
  for s in results.get("train_summaries", {}).values():
    # {scheme: summary} or, with seeds, {scheme: {seed: summary}}
    runs = s.values() if s and all(isinstance(v, dict) for v in s.values()) else [s]
    trained += sum(r.get("wall_time_s") or 0 for r in runs)
  lines = ["", f"Command: `{results.get('command', '?')}`  ",
           f"Machine: {results.get('machine', '?')}  ",
           f"Wall time of the run that wrote this: {results.get('wall_time_s', 0) / 60:.1f} min"
           + (f"; training wall time in its models' summaries: {trained / 60:.1f} min (a run "
              f"resumed after an interruption records only its last segment)" if trained else ""),
           ""]
  return "\n".join(lines)


def _module_name() -> str:
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  return spec.name if spec and spec.name else sys.argv[0]


def cpu_model() -> str:
  """The CPU's marketing name, for records of where a figure was measured."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"
