r"""Write a SLURM array script for a sweep: one array task per run, each on --nodes nodes.

  python -m launch.slurm --config configs/scaling.py --workdir /shared/sweeps/scaling \
      --nodes=2 --gpus_per_node=8 --partition=gpu --time=04:00:00 --max_parallel=8
  sbatch /shared/sweeps/scaling/slurm_array.sh

Writes DIR/sweep.json and DIR/slurm_array.sh (nothing runs until you sbatch it, or pass
--submit). DIR must be on a filesystem every node sees. A task whose run has a summary.json
exits at once; any other starts the run's `transformer.train` command with `srun`, one
process per node, each told the coordinator (the first node), the process count and its
SLURM_PROCID, so `jax.distributed` joins them into one job. SLURM sends SIGTERM two minutes
before the time limit and the trainer checkpoints, so resubmitting the same script resumes
every unfinished run. Each task refreshes DIR/results.md when its run ends.
Every --config.KEY=VALUE given here is passed on to every run, as with launch.local.
"""

import os
import shlex
import subprocess
import sys

from absl import flags
from ml_collections import config_flags

from launch import sweep
from transformer import cli

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The counts that may be 0, and what 0 means; --nodes must be at least 1.
_ZERO = dict(gpus_per_node="no --gpus-per-node line", cpus_per_task="SLURM's default",
             max_parallel="no limit")


def check_counts(**counts: int) -> None:
  """Refuse a negative count (or no nodes) before sweep.json is written: sbatch would take
  --gpus-per-node=-1 into the script and fail only when it is submitted."""
  for name, value in counts.items():
    if value < (0 if name in _ZERO else 1):
      least = f">= 0 (0: {_ZERO[name]})" if name in _ZERO else "at least 1"
      raise ValueError(f"--{name} must be {least}, got {value}")


def array_script(runs: list[dict], workdir: str, *, nodes: int = 1, gpus_per_node: int = 0,
                 cpus_per_task: int = 0, partition: str = "", account: str = "",
                 time: str = "04:00:00", max_parallel: int = 0, sbatch=(),
                 python: str = sys.executable, repo: str = _ROOT) -> str:
  """The text of an sbatch array script running `runs` (sweep.plan output) in `workdir`."""
  if not runs:
    raise ValueError("the sweep has no runs")
  check_counts(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task,
               max_parallel=max_parallel)
  workdir = os.path.abspath(workdir)
  array = f"0-{len(runs) - 1}" + (f"%{max_parallel}" if max_parallel else "")
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={shlex.quote('sweep-' + os.path.basename(workdir))}",
           f"#SBATCH --array={array}",
           f"#SBATCH --nodes={nodes}",
           "#SBATCH --ntasks-per-node=1",
           f"#SBATCH --time={time}",
           # sbatch reads quotes and '#' in its directives, and '%' as a file-name pattern.
           f"#SBATCH --output={shlex.quote(workdir.replace('%', '%%') + '/slurm/%A_%a.out')}",
           "#SBATCH --signal=TERM@120"]  # the trainer checkpoints on SIGTERM
  lines += [f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []
  lines += [f"#SBATCH --cpus-per-task={cpus_per_task}"] if cpus_per_task else []
  lines += [f"#SBATCH --partition={partition}"] if partition else []
  lines += [f"#SBATCH --account={account}"] if account else []
  lines += [f"#SBATCH {extra}" for extra in sbatch]
  lines += ["# Written by launch/slurm.py; one array task per run of sweep.json.",
            "set -euo pipefail",
            f"cd {shlex.quote(repo)}",
            f"WORKDIR={shlex.quote(workdir)}",
            "NAMES=(" + " ".join(shlex.quote(r["name"]) for r in runs) + ")",
            "COMMANDS=("]
  lines += [f"  {shlex.quote(shlex.join(r['command']))}" for r in runs]
  lines += [")",
            'name=${NAMES[$SLURM_ARRAY_TASK_ID]}',
            'cmd=${COMMANDS[$SLURM_ARRAY_TASK_ID]}',
            'if [[ -e "$WORKDIR/$name/summary.json" ]]; then',
            '  echo "$name: finished, skipping"; exit 0',
            "fi",
            'mkdir -p "$WORKDIR/$name"']
  if nodes > 1:
    # Not `| head -n 1`: with pipefail, scontrol's SIGPIPE would fail the task.
    lines += ['hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
              'head=${hosts[0]}',
              # A port from the task's own job id (unique per array task, across sweeps too):
              # the array index alone gave task 0 of two sweeps sharing a head node one port.
              "port=$((20000 + SLURM_JOB_ID % 20000))",
              'cmd="$cmd --coordinator_address=$head:$port --num_processes=$SLURM_NNODES"',
              'cmd="$cmd --process_id=\\$SLURM_PROCID"']  # expanded by each srun task
  lines += ['echo "$(date): $name on $SLURM_JOB_NODELIST: $cmd"',
            'status=0',
            'srun --kill-on-bad-exit=1 bash -c "exec $cmd" >> "$WORKDIR/$name/train.log" 2>&1 '
            "|| status=$?",
            f"{shlex.quote(python)} -m launch.sweep --workdir \"$WORKDIR\" > /dev/null || true",
            "exit $status", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  f = flags.FLAGS
  check_counts(nodes=f.nodes, gpus_per_node=f.gpus_per_node, cpus_per_task=f.cpus_per_task,
               max_parallel=f.max_parallel)
  if f.dry_run and f.submit:
    raise ValueError("--dry_run writes nothing, so there is nothing to --submit: drop one")
  config = cli.config(f["config"])
  workdir = os.path.abspath(f.workdir)
  config = sweep.with_sweep_flag(config, f.sweep, f.trials, f.sweep_seed)
  runs = sweep.plan(config, workdir, config_arg=config_flags.get_config_filename(f["config"]),
                    python=f.python, module=f.train_module,
                    extra_flags=sweep.passthrough_flags(f["config"]),
                    launcher=[sys.executable, "-m", "launch.slurm"] + sys.argv[1:],
                    write=not f.dry_run)
  text = array_script(runs, workdir, nodes=f.nodes, gpus_per_node=f.gpus_per_node,
                      cpus_per_task=f.cpus_per_task, partition=f.partition,
                      account=f.account, time=f.time, max_parallel=f.max_parallel,
                      sbatch=f.sbatch, python=f.python)
  if f.dry_run:
    print(text, end="")
    return
  os.makedirs(os.path.join(workdir, "slurm"), exist_ok=True)
  path = os.path.join(workdir, "slurm_array.sh")
  if os.path.exists(path) and open(path).read() != text:
    # It may hold hand edits: keep it beside the new one.
    n = 1
    while os.path.exists(os.path.join(workdir, f"slurm_array.{n}.sh")):
      n += 1
    os.replace(path, os.path.join(workdir, f"slurm_array.{n}.sh"))
    print(f"kept the earlier script as slurm_array.{n}.sh")
  with open(path, "w") as out:
    out.write(text)
  os.chmod(path, 0o755)
  done = sum(sweep.is_finished(os.path.join(workdir, r["name"])) for r in runs)
  print(f"{len(runs)} runs ({done} finished) -> {path}")
  if f.submit:
    subprocess.run(["sbatch", path], check=True)
  else:
    print(f"submit with: sbatch {path}")


if __name__ == "__main__":
  # Flags exist only when this runs as a program (see launch/local.py).
  config_flags.DEFINE_config_file("config", None, "Experiment config file[:args].")
  flags.DEFINE_string("workdir", None, "Sweep directory on a shared filesystem.")
  flags.DEFINE_string("sweep", "", "Grid/random axes for any config (see launch.local).")
  flags.DEFINE_integer("trials", None,
                       "Random-search trials for --sweep (>= 1; without it, a grid).")
  flags.DEFINE_integer("sweep_seed", None, "Seed of the random search's draws (default: the "
                       "config's sweep.seed, else 0); another seed draws other trials.")
  flags.DEFINE_integer("nodes", 1, "Nodes per run (>1: a multi-host jax job).")
  flags.DEFINE_integer("gpus_per_node", 0, "GPUs per node (0: no --gpus-per-node line).")
  flags.DEFINE_integer("cpus_per_task", 0, "CPUs per node (0: SLURM's default).")
  flags.DEFINE_string("partition", "", "SLURM partition.")
  flags.DEFINE_string("account", "", "SLURM account.")
  flags.DEFINE_string("time", "04:00:00", "Time limit of each run (array task).")
  flags.DEFINE_integer("max_parallel", 0, "Runs at a time (0: no limit).")
  flags.DEFINE_multi_string("sbatch", [], "Extra #SBATCH lines, e.g. --sbatch=--qos=high.")
  flags.DEFINE_string("python", sys.executable, "Python on the compute nodes.")
  flags.DEFINE_string("train_module", "transformer.train", "Module of each run.")
  flags.DEFINE_bool("submit", False, "Run sbatch on the script after writing it.")
  flags.DEFINE_bool("dry_run", False, "Check the plan and print the script; write nothing "
                    "(no directory, no sweep.json).")
  cli.run(main, required=("config", "workdir"))
