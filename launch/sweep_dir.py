"""A sweep directory on disk: which runs finished, every run's record, and DIR/results.md.

launch/sweep.py declares runs and writes DIR/sweep.json through atomic_write; this module reads
the directory back (sweep.json plus every DIR/*/summary.json) into the results table.
"""

import json
import math
import os
import socket

from transformer import schema


def format_cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


def is_finished(run_dir: str) -> bool:
  return os.path.exists(os.path.join(run_dir, "summary.json"))


def check_finished_configs(workdir: str, planned: dict[str, dict]) -> None:
  """Refuse a plan whose finished runs (DIR/<name>/summary.json) were trained with other
  settings than the plan gives them, checkpoint.BOOKKEEPING_KEYS and the sweep block aside:
  skipped as finished, they would stand in for runs this sweep never trained (an edited
  config file, or a run copied in). `planned`: run name -> its flat config. Keys only one
  side has were added or removed since (the default of an added key keeps the old behaviour)."""
  from transformer.training.checkpoint import BOOKKEEPING_KEYS  # noqa: PLC0415 (jax)
  for name, now in planned.items():
    run_dir = os.path.join(workdir, name)
    saved = _saved_config(run_dir) if is_finished(run_dir) else None
    if saved is None:
      continue
    differ = [k for k in sorted(saved.keys() & now.keys())
              if k not in BOOKKEEPING_KEYS and not k.startswith("sweep.")
              and _comparable(k, saved[k]) != _comparable(k, now[k])]
    if differ:
      raise ValueError(
          f"{run_dir} finished with other settings than this sweep gives it ("
          + ", ".join(f"{k}: {saved[k]!r} there vs {now[k]!r} now" for k in differ[:4])
          + (", ..." if len(differ) > 4 else "") + "), so it would be skipped as this sweep's "
          "run; use a new --workdir, or the settings it was trained with")


def _saved_config(run_dir: str) -> dict | None:
  """A finished run's flat config: its config.json, else its summary's copy (None if neither
  reads)."""
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      return schema.flatten(json.load(f))
  except (OSError, ValueError, AttributeError):
    pass
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      saved = json.load(f).get("config")
    return saved if isinstance(saved, dict) else None
  except (OSError, ValueError, AttributeError):
    return None


def _comparable(key: str, value):
  if key == "train.init_from" and value:
    return os.path.normpath(str(value))
  return json.loads(json.dumps(value))  # JSON has no tuples


def atomic_write(path: str, text: str) -> None:
  # Launchers on several hosts (or parallel array tasks) may write the same file; each writes
  # its own temporary and renames it, so a reader never sees half a file.
  tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def read_sweep(workdir: str) -> list[dict]:
  """Every run of DIR: those declared in sweep.json and any other DIR/*/summary.json.

  Each row has `name`, `declared` (from sweep.json, or {}) and `summary` (or None if the run
  has not finished).
  """
  declared = {}
  path = os.path.join(workdir, "sweep.json")
  if os.path.exists(path):
    with open(path) as f:
      declared = {r["name"]: r for r in json.load(f)["runs"]}
  names = list(declared)
  if os.path.isdir(workdir):
    names += sorted(n for n in os.listdir(workdir)
                    if n not in declared and is_finished(os.path.join(workdir, n)))
  rows = []
  for name in names:
    summary = None
    if is_finished(os.path.join(workdir, name)):
      with open(os.path.join(workdir, name, "summary.json")) as f:
        summary = json.load(f)
    rows.append(dict(name=name, declared=declared.get(name, {}), summary=summary))
  return rows


def results_table(workdir: str) -> str:
  """Markdown table of every run, finished ones sorted by final eval loss, then the rest."""
  rows = read_sweep(workdir)
  configs = [schema.flatten(r["summary"].get("config", {})) if r["summary"] else
             dict(r["declared"].get("overrides", {})) for r in rows]
  keys = sorted({k for c in configs for k in c})
  # An unfinished run only knows its overrides, so a key it lacks does not count as varying.
  varying = [k for k in keys if len({json.dumps(c[k], sort_keys=True, default=str)
                                     for c in configs if k in c}) > 1]
  head = ["run", *varying, "eval loss", "params (non-emb)", "tokens", "FLOPs", "wall time"]
  done = sorted((r for r in rows if r["summary"]), key=lambda r: _loss(r["summary"]))
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in done + [r for r in rows if not r["summary"]]:
    s, config = r["summary"] or {}, configs[rows.index(r)]
    cells = [r["name"], *(format_cell(config.get(k, "")) for k in varying)]
    if s:
      cells += [f"{_loss(s):.4f}", f"{s.get('params_non_embedding', 0):,}",
                f"{s.get('tokens', 0):.3g}", f"{s.get('flops', 0):.3g}",
                f"{s.get('wall_time_s', 0):.0f} s"]
    else:
      cells += ["not finished", "", "", "", ""]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _loss(summary: dict) -> float:
  loss = summary.get("final_eval_loss")
  return float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else math.inf


def write_results(workdir: str, keep_below: bool = True) -> str:
  """(Re)write DIR/results.md from what is on disk now. While the runs table is unchanged,
  what follows it (experiments.scaling.fit's fits) is kept (`keep_below`): a re-run that
  finds every run finished leaves the fits of those runs in place."""
  path = os.path.join(workdir, "results.md")
  table = results_table(workdir)
  if keep_below and os.path.exists(path):
    with open(path) as f:
      text = f.read()
    if text.startswith(table) and not text[len(table):].startswith("|"):  # no row more
      return path
  atomic_write(path, table)
  return path
