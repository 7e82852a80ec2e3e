"""The local / SLURM / TPU launchers (launch/local.py, slurm.py, sweep.py's plan and table).

Launcher tests run a fake trainer (tests/helpers/fake_train.py, the `fake_train` fixture: it
parses the same flags, "checkpoints" halfway when asked to fail, and writes summary.json), so
they take seconds and do not depend on transformer.train; one test runs a real 3-run sweep.
"""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers.launch_config import sweep_config as _config
from launch import local, slurm, sweep

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the local launcher ----------------------------------------------------------------------

def _calls(workdir):
  path = os.path.join(workdir, "calls.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_local_runs_in_parallel_skips_finished_and_tabulates(tmp_path, fake_train, monkeypatch):
  monkeypatch.setenv("FAKE_OVERLAP", "2")
  workdir = str(tmp_path / "sweep")
  config = _config(kind="grid", axes="opt.lr=1e-3,3e-3;model.d_model=64,128")
  result = local.run_sweep(config, workdir, config_arg="cfg.py", parallel=2,
                           train_module=fake_train, extra_flags=["--config.train.seed=0"],
                           log=lambda _: None)
  assert sorted(result["finished"]) == sorted(r["name"] for r in sweep.expand(config))
  calls = _calls(workdir)
  assert len(calls) == 4
  # Never more than 2 at once, and at some point 2 at once.
  events = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
  running = [sum(e for _, e in events[:i + 1]) for i in range(len(events))]
  assert max(running) == 2
  assert all("--config.train.seed=0" in c["argv"] for c in calls)
  if len(os.sched_getaffinity(0)) >= 2:  # each run pinned to its own share of the CPUs
    assert all(len(c["cpus"]) == len(os.sched_getaffinity(0)) // 2 for c in calls)
    assert len({tuple(c["cpus"]) for c in calls}) == 2
  if len(os.sched_getaffinity(0)) == 2:
    assert all("--xla_cpu_multi_thread_eigen=false" in c["xla"] for c in calls)
  with open(os.path.join(workdir, "sweep.json")) as f:
    declared = json.load(f)
  assert declared["sweep"]["kind"] == "grid" and len(declared["runs"]) == 4
  assert declared["runs"][0]["command"][2] == fake_train
  with open(os.path.join(workdir, "results.md")) as f:
    table = f.read().splitlines()
  assert table[0].split(" | ")[1:3] == ["model.d_model", "opt.lr"]  # train.seed never varies
  assert table[2].startswith("| lr=0.003,d_model=128 |")  # lowest loss first
  # A second launch finds everything finished and starts nothing, and keeps what a fit
  # (experiments.scaling.fit) wrote under the unchanged runs table.
  with open(os.path.join(workdir, "results.md"), "a") as f:
    f.write("\n## Fits\n")
  again = local.run_sweep(config, workdir, config_arg="cfg.py", parallel=2,
                          train_module=fake_train, extra_flags=["--config.train.seed=0"],
                          log=lambda _: None)
  assert len(again["skipped"]) == 4 and not again["finished"] and len(_calls(workdir)) == 4
  assert open(os.path.join(workdir, "results.md")).read().endswith("\n## Fits\n")


def test_a_sweep_dir_refuses_another_sweep_and_keeps_an_extended_ones_record(tmp_path,
                                                                              fake_train):
  workdir = str(tmp_path / "sweep")
  run = lambda axes, *flags, dry_run=False: local.run_sweep(
      _config(kind="grid", axes=axes), workdir, config_arg="cfg.py", train_module=fake_train,
      extra_flags=list(flags), log=lambda _: None, dry_run=dry_run)
  run("opt.lr=1e-3,3e-3")
  record = open(os.path.join(workdir, "sweep.json")).read()
  for axes, flags_, why in (("model.num_layers=1,2", [], "is not in this sweep"),
                            ("opt.lr=1e-3,3e-3", ["--config.model.d_model=128"],
                             "had another command")):
    for dry_run in (True, False):
      with pytest.raises(ValueError, match=rf"holds another sweep: its run 'lr=0.001' {why}"):
        run(axes, *flags_, dry_run=dry_run)
    assert open(os.path.join(workdir, "sweep.json")).read() == record
  files = sorted(os.listdir(workdir))
  assert run("opt.lr=1e-3,3e-3,1e-2", dry_run=True)["skipped"] == ["lr=0.001", "lr=0.003"]
  assert sorted(os.listdir(workdir)) == files  # a dry run writes nothing
  extended = run("opt.lr=1e-3,3e-3,1e-2")  # every started run kept: more of the same sweep
  assert extended["skipped"] == ["lr=0.001", "lr=0.003"] and extended["finished"] == ["lr=0.01"]
  assert open(os.path.join(workdir, "sweep.1.json")).read() == record


def test_results_md_keeps_a_fit_below_an_unchanged_table_only(tmp_path):
  path = tmp_path / "results.md"
  table = sweep.results_table(str(tmp_path))
  for below, kept in (("\n## Fits\n", True), ("| a dropped run | not finished |\n", False)):
    path.write_text(table + below)
    sweep.write_results(str(tmp_path))
    assert path.read_text() == (table + below if kept else table)


def test_the_same_flags_in_another_order_are_the_same_sweep(tmp_path):
  os.makedirs(tmp_path / "a")  # a started run
  run = lambda *flags: {"name": "a", "command": ["python", "-m", "transformer.train",
                                                 f"--workdir={tmp_path}/a", *flags]}
  sweep.check_same_sweep(str(tmp_path), [run("--config.x=1", "--config.y=2")],
                         [run("--config.y=2", "--config.x=1")])
  with pytest.raises(ValueError, match="its run 'a' had another command"):
    sweep.check_same_sweep(str(tmp_path), [run("--config.x=1")], [run("--config.x=2")])


def test_sweep_table_refuses_a_folder_that_is_not_a_sweep(tmp_path):
  (tmp_path / "results.md").write_text("an experiment's results")
  proc = subprocess.run([sys.executable, "-m", "launch.sweep", "--workdir", str(tmp_path)],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      f"error: {tmp_path} is not a sweep directory (no sweep.json, no finished runs in it)"]
  assert (tmp_path / "results.md").read_text() == "an experiment's results"


def test_local_resumes_interrupted_runs(tmp_path, fake_train, monkeypatch):
  workdir = str(tmp_path / "sweep")
  config = _config(kind="grid", axes="opt.lr=1e-3,3e-3")
  monkeypatch.setenv("FAKE_INTERRUPT", "1")
  first = local.run_sweep(config, workdir, config_arg="cfg.py", train_module=fake_train,
                          log=lambda _: None)
  assert len(first["failed"]) == 2 and not first["finished"]
  with open(os.path.join(workdir, "results.md")) as f:
    assert f.read().count("not finished") == 2
  monkeypatch.delenv("FAKE_INTERRUPT")
  second = local.run_sweep(config, workdir, config_arg="cfg.py", train_module=fake_train,
                           log=lambda _: None)
  assert len(second["finished"]) == 2
  assert [c["resumed"] for c in _calls(workdir)] == [0, 0, 5, 5]  # from the "checkpoint"


def test_a_run_stopped_before_its_loop_is_reported_stopped(tmp_path, fake_train, monkeypatch):
  import signal
  import threading
  workdir = str(tmp_path / "sweep")
  monkeypatch.setenv("FAKE_SLOW_START", "1")
  lines = []

  def stop_when_started():
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(workdir, "starting")) and time.time() < deadline:
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # as a user's kill of the launcher
  threading.Thread(target=stop_when_started, daemon=True).start()
  got = local.run_sweep(_config(kind="grid", axes="opt.lr=1e-3"), workdir, config_arg="cfg.py",
                        train_module=fake_train, log=lines.append)
  assert not got["failed"] and not got["finished"], lines
  assert any(line.startswith("stopped") for line in lines), lines


def test_child_env_and_cpu_groups():
  assert local.cpu_groups(2, [0, 1, 2, 3]) == [[0, 2], [1, 3]]
  assert local.cpu_groups(3, [0, 1]) == [[0], [1], [0]]
  env = local.child_env([0], 2, base={"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
  assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_cpu_multi_thread_eigen=false"
  assert env["OMP_NUM_THREADS"] == "1" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45"
  assert local.child_env([0, 1], 1, base={}) == {}  # one run at a time: untouched


def _dry_run(tmp_path, *flags):
  """The transformer.train commands `launch.local --dry_run` prints."""
  proc = subprocess.run(
      [sys.executable, "-m", "launch.local", f"--workdir={tmp_path / 'sweep'}", "--dry_run",
       *flags], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return [line for line in proc.stdout.splitlines() if "transformer.train" in line]


def test_local_cli_dry_run_any_config(tmp_path):
  commands = _dry_run(tmp_path, "--config=configs/lm.py:size=xs", "--sweep=opt.lr=1e-3,3e-3",
                      "--config.train.steps=7")
  assert len(commands) == 2 and all("--config.train.steps=7" in c for c in commands)
  assert "--config.opt.lr=0.003" in commands[1]
  assert not (tmp_path / "sweep").exists()  # nothing ran, nothing written
  proc = subprocess.run(
      [sys.executable, "-m", "launch.local", "--config=configs/lm.py:size=xs",
       f"--workdir={tmp_path / 'sweep'}", "--sweep=opt.lr=1e-3", "--parallel=0"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "error: --parallel must be at least 1" in proc.stderr


def test_real_tiny_sweep_end_to_end(tmp_path):
  workdir = str(tmp_path / "sweep")
  cmd = [sys.executable, "-m", "launch.local", "--config=configs/scaling.py:tiny=true",
         f"--workdir={workdir}", "--parallel=2"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(os.path.join(workdir, "sweep.json")) as f:
    runs = json.load(f)["runs"]
  assert len(runs) == 3
  for r in runs:
    with open(os.path.join(workdir, r["name"], "summary.json")) as f:
      summary = json.load(f)
    # The planner's counts are the trainer's counts.
    for key in ("params_total", "params_non_embedding", "tokens", "flops_per_token", "flops",
                "flops_per_token_total", "flops_total"):
      assert summary[key] == r[key], key
    assert summary["step"] == r["overrides"]["train.steps"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert "3 finished, 0 to run" in proc.stdout


# --- cluster launchers -----------------------------------------------------------------------

def test_slurm_array_script_runs_each_task(tmp_path, fake_train):
  workdir = str(tmp_path / "my sweep%1")  # sbatch splits an unquoted space, reads % patterns
  config = _config(kind="grid", axes="opt.lr=1e-3,3e-3")
  runs = sweep.plan(config, workdir, config_arg="cfg.py", python=sys.executable,
                    module=fake_train)
  text = slurm.array_script(runs, workdir, nodes=2, gpus_per_node=8, partition="gpu",
                            max_parallel=1, python=sys.executable, repo=ROOT)
  assert "#SBATCH --array=0-1%1" in text and "#SBATCH --nodes=2" in text
  assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --signal=TERM@120" in text
  assert f"#SBATCH --output='{tmp_path}/my sweep%%1/slurm/%A_%a.out'" in text
  script = tmp_path / "array.sh"
  script.write_text(text)
  # Stand-ins for SLURM's tools: srun runs each of $SLURM_NNODES tasks with its SLURM_PROCID.
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "srun").write_text('#!/bin/bash\nshift\nfor i in $(seq 0 $((SLURM_NNODES - 1))); '
                                'do SLURM_PROCID=$i "$@" || exit $?; done\n')
  (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-a; echo node-b\n")
  for tool in ("srun", "scontrol"):
    os.chmod(bin_dir / tool, 0o755)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             SLURM_NNODES="2", SLURM_JOB_NODELIST="node-[a-b]")
  for task in ("0", "1", "0"):  # the third is a resubmission of a finished task
    proc = subprocess.run(["bash", str(script)], env=dict(
        env, SLURM_ARRAY_TASK_ID=task, SLURM_JOB_ID=str(54321 + int(task))),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "finished, skipping" in proc.stdout
  calls = _calls(workdir)
  assert len(calls) == 4  # 2 runs x 2 processes, none for the skipped task
  first = [c["argv"] for c in calls if c["name"] == runs[0]["name"]]
  assert [a[-3:] for a in first] == [
      ["--coordinator_address=node-a:34321", "--num_processes=2", f"--process_id={i}"]
      for i in (0, 1)]
  assert os.path.exists(os.path.join(workdir, "results.md"))


def test_tpu_vm_script_dry_run(tmp_path):
  script = os.path.join(ROOT, "launch", "tpu_vm.sh")
  assert subprocess.run(["bash", "-n", script]).returncode == 0
  proc = subprocess.run(
      ["bash", script, "my-tpu", "us-central2-b", "--config", "configs/scaling.py",
       "--workdir", "/mnt/shared/s"], env=dict(os.environ, DRY_RUN="1"),
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("gcloud compute tpus tpu-vm scp")
  assert "--worker=all" in lines[-1] and "launch.local\\ --multihost" in lines[-1]
  proc = subprocess.run(["bash", script, "t", "z", "--parallel=2"], capture_output=True,
                        text=True, env=dict(os.environ, DRY_RUN="1"))
  assert proc.returncode == 2 and "one at a time" in proc.stderr


def test_slurm_keeps_a_hand_edited_script(tmp_path):
  cmd = [sys.executable, "-m", "launch.slurm", "--config", "configs/lm.py:size=xs",
         "--workdir", str(tmp_path), "--sweep=opt.lr=1e-3,3e-3"]
  subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=120)
  script = tmp_path / "slurm_array.sh"
  script.write_text(script.read_text() + "# my edit\n")
  again = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
  assert "kept the earlier script as slurm_array.1.sh" in again.stdout
  assert (tmp_path / "slurm_array.1.sh").read_text().endswith("# my edit\n")
  assert "# my edit" not in script.read_text()


# --- from a mutation audit: stops, multihost logs, passthrough, slurm rewrites ---------------

def test_a_run_that_exits_0_without_a_summary_is_not_finished(tmp_path, monkeypatch):
  """Only summary.json marks a run finished: a trainer that exits 0 without one (stopped
  inside its loop by its own SIGTERM, a preemption) is retried, not counted done."""
  (tmp_path / "quits.py").write_text("import sys\n")  # exits 0, writes nothing
  monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
  got = local.run_sweep(_config(kind="grid", axes="opt.lr=1e-3"), str(tmp_path / "sweep"),
                        config_arg="cfg.py", train_module="quits", log=lambda _: None)
  assert got == dict(finished=[], skipped=[], failed=["lr=0.001"])


def test_a_signal_starts_none_of_the_queued_runs(tmp_path, fake_train, monkeypatch):
  """Ctrl-C (or SIGTERM) while a run trains stops it after its checkpoint and starts none of
  the runs still queued."""
  workdir = str(tmp_path / "sweep")
  monkeypatch.setenv("FAKE_SLOW_START", "1")

  def stop_when_started():
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(workdir, "starting")) and time.time() < deadline:
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
  threading.Thread(target=stop_when_started, daemon=True).start()
  got = local.run_sweep(_config(kind="grid", axes="opt.lr=1e-3,3e-3"), workdir,
                        config_arg="cfg.py", train_module=fake_train, log=lambda _: None)
  assert got == dict(finished=[], skipped=[], failed=[])
  assert not os.path.exists(os.path.join(workdir, "lr=0.003"))  # never started


def test_multihost_runs_log_per_host(tmp_path, fake_train):
  """With --multihost every host runs the same runs in the shared DIR: each writes its own
  train.<host>.log, not one train.log that all hosts append to."""
  workdir = str(tmp_path / "sweep")
  local.run_sweep(_config(kind="grid", axes="opt.lr=1e-3"), workdir, config_arg="cfg.py",
                  train_module=fake_train, multihost=True, log=lambda _: None)
  assert sorted(n for n in os.listdir(os.path.join(workdir, "lr=0.001")) if ".log" in n) == [
      f"train.{socket.gethostname()}.log"]


def test_eigen_threads_stay_on_with_more_than_one_cpu_per_run():
  """Only a run pinned to a single CPU gets --xla_cpu_multi_thread_eigen=false."""
  env = local.child_env([0, 1], 2, base={})
  assert "XLA_FLAGS" not in env and env["OMP_NUM_THREADS"] == "2"


def test_a_sweep_dir_may_drop_runs_that_never_started_and_be_named_another_way(tmp_path):
  """check_same_sweep refuses only a change to a started run (one with a directory); the
  run directory in a command (DIR given relative or absolute) is not part of the run."""
  os.makedirs(tmp_path / "a")  # started; "b" never did
  run = lambda name, where=str(tmp_path): {"name": name, "command": [
      "python", "-m", "transformer.train", f"--workdir={where}/{name}", "--config.x=1"]}
  sweep.check_same_sweep(str(tmp_path), [run("a"), run("b")], [run("a")])
  sweep.check_same_sweep(str(tmp_path), [run("a", "rel/dir")], [run("a")])


def test_a_scaling_sweep_takes_a_launcher_flag_for_the_keys_it_caps(tmp_path):
  """A scaling design caps log/eval/checkpoint intervals (and warmup) at the config's values,
  so a launcher's --config flag for them takes effect and is passed on, not refused."""
  config = _config(kind="scaling", sizes="5e4", budgets="1e12")
  runs = sweep.expand(config)
  flags = ["--config.train.log_every=5", "--config.opt.warmup_steps=3"]
  sweep.check_passthrough(config, runs, flags)
  with pytest.raises(ValueError, match="--config.train.steps would be ignored"):
    sweep.check_passthrough(config, runs, ["--config.train.steps=9"])


def test_the_launchers_sweep_flags_are_not_passed_to_the_runs(tmp_path):
  """--config.sweep.* flags shape the plan; the runs (transformer.train) never see them."""
  commands = _dry_run(tmp_path, "--config=configs/scaling.py:tiny=true",
                      "--config.sweep.min_steps=1", "--config.train.seed=3")
  assert commands and all("--config.train.seed=3" in c and "--config.sweep." not in c
                          for c in commands)


def test_slurm_rewrites_an_unchanged_script_in_place(tmp_path):
  """Re-running the same launch.slurm command keeps no copy of an identical script."""
  cmd = [sys.executable, "-m", "launch.slurm", "--config", "configs/lm.py:size=xs",
         "--workdir", str(tmp_path), "--sweep=opt.lr=1e-3,3e-3"]
  for _ in range(2):
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
  assert "kept the earlier script" not in done.stdout
  assert not (tmp_path / "slurm_array.1.sh").exists()


# --- the sweep directory's table ----------------------------------------------------------

def _finished(workdir, name, loss, config=None):
  os.makedirs(os.path.join(workdir, name), exist_ok=True)
  with open(os.path.join(workdir, name, "summary.json"), "w") as f:
    json.dump(dict(final_eval_loss=loss, config=config or {}), f)


def test_results_table_ranks_a_diverged_run_last_and_lists_only_runs(tmp_path):
  """A run whose loss is NaN ranks below every finished run; a folder of the sweep directory
  that is no run (slurm/ logs) is no row."""
  _finished(str(tmp_path), "a", math.nan, {"opt.lr": 1.0})
  _finished(str(tmp_path), "b", 3.0, {"opt.lr": 0.1})
  os.makedirs(tmp_path / "slurm")
  rows = sweep.results_table(str(tmp_path)).splitlines()[2:]
  assert [r.split(" | ")[0] for r in rows] == ["| b", "| a"]
