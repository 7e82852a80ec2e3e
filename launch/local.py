r"""Run a sweep on this machine, N runs at a time, each `transformer.train` in DIR/<run>/.

  python -m launch.local --config configs/scaling.py --workdir DIR --parallel 2
  python -m launch.local --config configs/lm.py:size=xs --workdir DIR \
      --sweep="opt.lr=1e-3,3e-3;model.num_layers=2,4"        # a grid, any config
  python -m launch.local --config configs/lm.py:size=xs --workdir DIR \
      --sweep="opt.lr=loguniform(1e-4,1e-2)" --trials=8       # random search
  python -m launch.local ... --dry_run        # check, print the commands; write nothing

The sweep comes from `config.sweep` (launch/sweep.py) or, for any config, from --sweep (grid
axes; with --trials, random-search distributions). Every --config.KEY=VALUE given here is
passed on to every run. Re-running the same command is how a sweep resumes: runs with a
summary.json are skipped (a finished run whose config.json differs from the run's config now,
bookkeeping keys aside, is refused: an edited config file) and the others re-run their own
command, which resumes from their latest checkpoint. A DIR holding another sweep (a started run missing from this one, or with
another command) is refused; a sweep that keeps every started run (a grid extended) is
written, the earlier sweep.json kept as sweep.1.json. Each run's output goes to
DIR/<run>/train.log; DIR/results.md is rewritten as runs finish. Ctrl-C forwards the signal,
so the runs checkpoint before they stop; a launcher killed outright (kill -9) takes its runs
with it (on Linux each gets SIGTERM, so it checkpoints too: `_die_with_launcher`).

With --parallel N > 1 the machine's CPUs are split into N groups and each run is pinned to
one (see child_env); on a GPU each run may use 0.9/N of its memory.
"""

import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags

from launch import sweep
from transformer import cli


def cpu_groups(parallel: int, cpus: list[int]) -> list[list[int]]:
  """Split the usable CPUs into `parallel` disjoint groups (shared round-robin if too few)."""
  if parallel <= len(cpus):
    return [cpus[i::parallel] for i in range(parallel)]
  return [[cpus[i % len(cpus)]] for i in range(parallel)]


def child_env(cpus: list[int], parallel: int, base: dict | None = None) -> dict:
  """Environment of one run: with parallel runs, thread pools sized to its CPU group.

  XLA:CPU sizes its thread pool from the CPUs a process may use, so pinning a run to its
  group (`_pinned`) is what really stops N runs from each starting threads for every
  core. On one core, Eigen's threading is switched off outright. BLAS/OpenMP pools follow.
  """
  env = dict(os.environ if base is None else base)
  if parallel > 1:
    threads = str(len(cpus))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
      env[var] = threads
    if len(cpus) == 1 and "xla_cpu_multi_thread_eigen" not in env.get("XLA_FLAGS", ""):
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    # On one GPU, parallel runs must not each preallocate 75% of its memory.
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / parallel:.2f}")
  return env


@contextlib.contextmanager
def _pinned(cpus):
  """Pin this thread to `cpus` while a child is forked from it; the child keeps the mask.

  (A preexec_fn would run Python in the forked child, which is unsafe once a threaded library
  such as jax is loaded in the parent, e.g. in tests.)
  """
  if cpus is None or not hasattr(os, "sched_setaffinity"):
    yield
    return
  before = os.sched_getaffinity(0)
  os.sched_setaffinity(0, cpus)
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_launcher(launcher_pid: int):
  """A preexec_fn: the kernel sends the run SIGTERM when the launcher dies, however it dies
  (the run then checkpoints and exits), so a killed launcher leaves no trainer behind.

  It runs in the forked child before exec and only makes system calls (no imports, no locks
  another thread could hold), which is what keeps a preexec_fn safe in a threaded parent."""
  def preexec():
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
      os.kill(os.getpid(), signal.SIGTERM)
  return preexec if _LIBC is not None else None


def run_sweep(config, workdir: str, *, config_arg: str, parallel: int = 1,
              train_module: str = "transformer.train", extra_flags=(), dry_run: bool = False,
              multihost: bool = False, log=print) -> dict:
  """Run every unfinished run of `config.sweep`; returns {'finished', 'skipped', 'failed'}."""
  if parallel < 1:
    raise ValueError(f"--parallel must be at least 1, got {parallel}")
  if multihost and parallel > 1:
    raise ValueError("--multihost runs use every host together: one at a time (--parallel=1)")
  runs = sweep.plan(config, workdir, config_arg=config_arg, python=sys.executable,
                    module=train_module, extra_flags=extra_flags,
                    launcher=[sys.executable, "-m", "launch.local"] + sys.argv[1:],
                    write=not dry_run)
  commands = {r["name"]: r["command"] for r in runs}
  # On a TPU slice every host runs this same loop and the same runs; each keeps its own log.
  log_name = f"train.{socket.gethostname()}.log" if multihost else "train.log"
  skipped = [r["name"] for r in runs if sweep.is_finished(os.path.join(workdir, r["name"]))]
  todo = [r["name"] for r in runs if r["name"] not in skipped]
  log(f"{len(runs)} runs in {workdir}: {len(skipped)} finished, {len(todo)} to run "
      f"({parallel} at a time)")
  if dry_run:
    for name in todo:
      log(shlex.join(commands[name]))
    return dict(finished=[], skipped=skipped, failed=[])

  cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
      list(range(os.cpu_count() or 1))
  free = cpu_groups(parallel, cpus)
  running, finished, failed = {}, [], []  # running: Popen -> (name, cpus, start, log file)
  queue = list(todo)

  stopping = []

  def forward(signum, frame):
    del frame
    for proc in running:
      proc.send_signal(signum)  # the trainer checkpoints and exits on SIGINT / SIGTERM
    queue.clear()
    stopping.append(signum)
    log(f"signal {signum}: stopping {len(running)} runs after their checkpoints")

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    while queue or running:
      while queue and free:
        name, group = queue.pop(0), free.pop(0)
        run_dir = os.path.join(workdir, name)
        os.makedirs(run_dir, exist_ok=True)
        out = open(os.path.join(run_dir, log_name), "a")
        out.write(f"\n$ {shlex.join(commands[name])}\n")
        out.flush()
        # Its own session: a terminal's Ctrl-C reaches only the launcher, which forwards it
        # once (a second signal makes the trainer quit without its checkpoint).
        with _pinned(group if parallel > 1 else None):
          proc = subprocess.Popen(commands[name], stdout=out, stderr=subprocess.STDOUT,
                                  env=child_env(group, parallel), start_new_session=True,
                                  preexec_fn=_die_with_launcher(os.getpid()))
        running[proc] = (name, group, time.time(), out)
        log(f"start  {name}  (cpus {','.join(map(str, group))})")
      time.sleep(0.2)
      for proc in [p for p in running if p.poll() is not None]:
        name, group, start, out = running.pop(proc)
        out.close()
        free.append(group)
        run_dir = os.path.join(workdir, name)
        if proc.returncode == 0 and sweep.is_finished(run_dir):
          finished.append(name)
          log(f"done   {name}  in {time.time() - start:.0f}s  "
              f"[{len(finished) + len(skipped)}/{len(runs)}]")
        # A trainer stopped inside its loop checkpoints and exits 0; one stopped before it
        # exits 128 + the signal it was forwarded. Either resumes on a re-run.
        elif stopping and proc.returncode in (0, *(128 + s for s in stopping)):
          log(f"stopped {name}  (re-run the same command to resume it)")
        else:
          failed.append(name)
          log(f"FAILED {name}  (exit {proc.returncode}; see {run_dir}/{log_name})")
        sweep.write_results(workdir)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  path = sweep.write_results(workdir)
  log(f"{len(finished)} finished, {len(skipped)} skipped, {len(failed)} failed; "
      f"results: {path}")
  return dict(finished=finished, skipped=skipped, failed=failed)


def main(argv):
  del argv
  f = flags.FLAGS
  config = sweep.with_sweep_flag(cli.config(f["config"]), f.sweep, f.trials, f.sweep_seed)
  result = run_sweep(config, cli.directory(f.workdir),
                     config_arg=config_flags.get_config_filename(f["config"]),
                     parallel=f.parallel, train_module=f.train_module,
                     extra_flags=sweep.passthrough_flags(f["config"]), dry_run=f.dry_run,
                     multihost=f.multihost)
  if result["failed"]:
    failed = result["failed"]
    raise SystemExit(f"error: {len(failed)} run{'s' if len(failed) > 1 else ''} failed "
                     f"({', '.join(failed)}): see {f.workdir}/<run>/train.log, then re-run the "
                     f"same command to retry {'them' if len(failed) > 1 else 'it'}")


if __name__ == "__main__":
  # Flags exist only when this runs as a program, so launchers and the trainer (which all
  # define --config) can be imported side by side.
  config_flags.DEFINE_config_file("config", None, "Experiment config file[:args].")
  flags.DEFINE_string("workdir", None, "Sweep directory; each run gets DIR/<run>/.")
  flags.DEFINE_integer("parallel", 1, "Runs at a time.")
  flags.DEFINE_string("sweep", "", "Grid axes 'key=v1,v2;key=v1,v2' (any config); with "
                      "--trials, random axes 'key=loguniform(a,b);key=choice(x,y)'.")
  flags.DEFINE_integer("trials", None,
                       "Random-search trials for --sweep (>= 1; without it, a grid).")
  flags.DEFINE_integer("sweep_seed", None, "Seed of the random search's draws (default: the "
                       "config's sweep.seed, else 0); another seed draws other trials.")
  flags.DEFINE_string("train_module", "transformer.train",
                      "Module run as `python -m MODULE` for each run.")
  flags.DEFINE_bool("dry_run", False, "Check the plan and print the commands only; writes "
                    "nothing (not even sweep.json).")
  flags.DEFINE_bool("multihost", False,
                    "One of several identical launchers, one per host of a TPU slice "
                    "(launch/tpu_vm.sh): each run spans all hosts; DIR must be shared; logs go "
                    "to train.<host>.log.")
  cli.run(main, required=("config", "workdir"))
