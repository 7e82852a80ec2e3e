"""Writing an experiment's results: the same record for every experiment."""

import json
import os
import platform
import time

import jax


def write(results: dict, workdir: str, start: float, write_plots) -> dict:
  """Adds wall time and machine, writes workdir/results.json (keys as a JSON reader sees
  them: strings) and the experiment's plots and table; returns what was written."""
  results["wall_time_s"] = time.time() - start
  results["machine"] = (f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} "
                        f"on {jax.default_backend()}")
  results = json.loads(json.dumps(results))
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  write_plots(results, workdir)
  print(f"wrote {workdir}/results.json, results.md and plots in {time.time() - start:.0f}s")
  return results
