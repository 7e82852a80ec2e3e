"""Sweep declarations, the shape rule and counts, and the local / SLURM / TPU launchers.

Launcher tests run a fake trainer (tests/helpers/fake_train.py: it parses the same flags,
"checkpoints" halfway when asked to fail, and writes summary.json), so they take seconds and do not depend
on transformer.train; one test runs a real 3-run sweep.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
import time

import ml_collections
import pytest

from experiments.scaling import shapes
from launch import local, slurm, sweep

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def _config(**sweep_settings):
  """A stand-in for configs/lm.py: the keys the sweep reads, without the data pipeline."""
  config = ml_collections.ConfigDict(dict(
      model=dict(kind="decoder", vocab_size=260, ffn="gelu", tie_embeddings=True, d_model=64,
                 num_layers=2, num_heads=2, num_kv_heads=0, head_dim=0, d_ff=256, window=0),
      data=dict(seq_len=128), train=dict(steps=100, batch_size=16, log_every=25,
                                         eval_every=50, checkpoint_every=50),
      opt=dict(lr=1e-3, warmup_steps=50, weight_decay=0.1), sweep=sweep.default_config()))
  config.sweep.update(sweep_settings)
  return config


# --- declarations --------------------------------------------------------------------------------

def test_grid_expands_every_combination_with_typed_values():
  runs = sweep.expand(_config(kind="grid", axes="opt.lr=1e-3,3e-3; model.d_model=64,128"))
  assert [r["name"] for r in runs] == ["lr=0.001,d_model=64", "lr=0.001,d_model=128",
                                       "lr=0.003,d_model=64", "lr=0.003,d_model=128"]
  assert runs[1]["overrides"] == {"opt.lr": 0.001, "model.d_model": 128}
  assert isinstance(runs[1]["overrides"]["model.d_model"], int)
  cmd = sweep.train_command("python", "transformer.train", "configs/lm.py:size=xs", "D/r",
                            runs[1]["overrides"], ("--config.train.seed=3",))
  assert cmd == ["python", "-m", "transformer.train", "--config=configs/lm.py:size=xs",
                 "--workdir=D/r", "--config.train.seed=3", "--config.opt.lr=0.001",
                 "--config.model.d_model=128"]


def test_run_names_are_deterministic_distinct_and_safe():
  assert sweep.run_name({"opt.lr": 3e-4, "model.d_model": 64}) == "lr=0.0003,d_model=64"
  # Two keys with one leaf keep their full paths rather than collide.
  assert sweep.run_name({"a.dropout": 0.1, "b.dropout": 0.2}) == "a.dropout=0.1,b.dropout=0.2"
  assert sweep.run_name({"data.name": "a/b c"}) == "name=a_b_c"
  long = sweep.run_name({f"k{i}": "x" * 20 for i in range(10)})
  assert len(long) == 120 and long == sweep.run_name({f"k{i}": "x" * 20 for i in range(10)})


def test_random_search_is_seeded_and_in_range():
  axes = "opt.lr=loguniform(1e-4,1e-2);model.d_model=choice(64,128);opt.warmup_steps=int(1,3)"
  runs = sweep.expand(_config(kind="random", axes=axes, trials=12, seed=7))
  assert runs == sweep.expand(_config(kind="random", axes=axes, trials=12, seed=7))
  assert runs != sweep.expand(_config(kind="random", axes=axes, trials=12, seed=8))
  assert len({r["name"] for r in runs}) == len(runs) <= 12
  for r in runs:
    o = r["overrides"]
    assert 1e-4 <= o["opt.lr"] <= 1e-2 and o["model.d_model"] in (64, 128)
    assert o["opt.warmup_steps"] in (1, 2, 3)


@pytest.mark.parametrize("settings, message", [
    (dict(kind="bayes"), "valid: .*grid.*random.*scaling"),
    (dict(kind="grid", axes=""), "sweep.axes is empty"),
    (dict(kind="grid", axes="opt.lr"), "not KEY=VALUES"),
    (dict(kind="grid", axes="opt.lrr=1,2"), "opt has no 'lrr'; valid: .*'lr'"),
    (dict(kind="random", axes="opt.lr=normal(0,1)"), "NAME one of .*loguniform"),
    (dict(kind="scaling", sizes="1e5"), "exactly one of sweep.budgets"),
    (dict(kind="scaling", sizes="1e5", budgets="1e12", tokens="1e6"), "exactly one"),
    (dict(kind="scaling", sizes="big", budgets="1e12"), "sizes must be positive numbers"),
    (dict(kind="scaling", sizes="1e5", budgets="1e3"), "design is empty"),
])
def test_bad_sweeps_fail_with_one_line(settings, message):
  with pytest.raises(ValueError, match=message):
    sweep.expand(_config(**settings))


def test_isoflop_design_hits_its_budgets():
  config = _config(kind="scaling", sizes="5e4,2e5,8e5", budgets="1e12,1e13")
  runs = sweep.expand(config)
  assert len(runs) == 6 and runs[0]["name"] == "N=5e4,C=1e12"
  for r in runs:
    o = r["overrides"]
    model = config.model.to_dict() | {k[6:]: v for k, v in o.items() if k.startswith("model.")}
    counts = shapes.param_counts(model)
    assert r["params_non_embedding"] == counts["non_embedding"]
    assert r["params_total"] == counts["non_embedding"] + 260 * model["d_model"]
    assert r["tokens"] == o["train.steps"] * 16 * 128
    assert r["flops"] == shapes.flops_per_token(model, 128) * r["tokens"]
    # Steps are whole, so the budget is met to within half a step.
    assert abs(r["flops"] - r["budget"]) <= 0.5 * r["flops"] / o["train.steps"] + 1
    assert o["train.eval_every"] <= max(1, o["train.steps"] // 10)
    assert o["opt.warmup_steps"] <= max(1, o["train.steps"] // 10)
  # Points that would train for fewer than min_steps are dropped.
  config.sweep.min_steps = 200
  assert all(r["overrides"]["train.steps"] >= 200 for r in sweep.expand(config))


def test_token_design_trains_on_its_tokens():
  runs = sweep.expand(_config(kind="scaling", sizes="1e5,1e6", tokens="2048000,4096000"))
  assert [r["tokens"] for r in runs] == [2048000, 4096000] * 2
  assert all(r["budget"] is None for r in runs)


@pytest.mark.parametrize("target", [1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 1e8, 1e9])
def test_shape_rule_lands_near_target(target):
  s = shapes.shape_for_size(target)
  n = shapes.param_counts(dict(s, vocab_size=0))["non_embedding"]
  # Widths step by head_dim (32), coarse for small models: the docstring's stated bounds.
  assert abs(math.log(n / target)) < math.log(1.4 if target < 1e5 else
                                              1.25 if target < 1e6 else 1.12)
  assert s["d_model"] == s["num_heads"] * s["head_dim"] and s["d_ff"] == 4 * s["d_model"]
  if target >= 1e6:  # tiny models have too few layers for the ratio to mean much
    assert 16 <= s["d_model"] / s["num_layers"] <= 64


_INSPECT = textwrap.dedent("""
    import json, sys
    from transformer import schema
    from transformer.analysis import model_stats
    from transformer.training import throughput
    out = []
    for model in json.loads(sys.argv[1]):
      cfg = schema.model_config(**model)
      counts = model_stats.count_params(cfg)
      terms = model_stats.flops_per_token(cfg, 256)
      out.append(dict(total=counts["total"], non_embedding=counts["non_embedding"],
                      inspect_flops=terms["total"],
                      train_flops=throughput.flops_per_token(cfg, 256, counts["non_embedding"]),
                      inspect_flops_total=terms["total_params_convention"],
                      train_flops_total=throughput.flops_per_token(
                          cfg, 256, counts["non_embedding"], counts["total"],
                          convention="total")))
    print(json.dumps(out))
""")


def test_counts_and_flops_match_the_model_code():
  models = []
  for target, ffn, kv, window in ((1e5, "gelu", 0, 0), (1e6, "swiglu", 1, 0),
                                  (3e6, "gelu", 0, 64)):
    models.append(dict(shapes.shape_for_size(target), ffn=ffn, num_kv_heads=kv, window=window))
  # The corrected rule's smallest shapes (head_dim 16 below d_model 64), untied head too.
  for target, tie in ((3.5e4, True), (1.39e5, False)):
    models.append(dict(shapes.shape_for_size(target, min_layers=2, min_heads=2,
                                             small_head_dim=16, count="total",
                                             vocab_size=260), tie_embeddings=tie))
  # A subprocess: transformer.inspect defines absl flags that clash with transformer.train's.
  proc = subprocess.run([sys.executable, "-c", _INSPECT, json.dumps(models)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  from transformer import schema
  for model, want in zip(models, json.loads(proc.stdout.splitlines()[-1])):
    cfg = schema.model_config(**model)
    got = shapes.param_counts(cfg)
    assert (got["total"], got["non_embedding"]) == (want["total"], want["non_embedding"])
    assert shapes.flops_per_token(cfg, 256) == want["inspect_flops"] == want["train_flops"]
    assert shapes.flops_per_token(cfg, 256, "total") == want["inspect_flops_total"] == \
        want["train_flops_total"]
    # The two conventions differ by exactly the embedding / output-projection parameters.
    assert want["inspect_flops_total"] - want["inspect_flops"] == \
        6 * (want["total"] - want["non_embedding"])


def test_scaling_config_builds_every_design():
  from configs import scaling  # pylint: disable=import-outside-toplevel
  configs = {d: scaling.get_config(f"design={d},tiny=true") for d in scaling.DESIGNS}
  assert [len(sweep.expand(configs[d])) for d in ("isoflop", "tokens", "lr", "random")] == \
      [3, 3, 8, 8]
  assert all(sweep.expand(c) for c in configs.values())
  with pytest.raises(ValueError, match="valid: .*isoflop"):
    scaling.get_config("design=fast")


# --- the local launcher ----------------------------------------------------------------------

@pytest.fixture
def fake_train(tmp_path, monkeypatch):
  monkeypatch.setenv("PYTHONPATH", f"{os.path.join(ROOT, 'tests', 'helpers')}{os.pathsep}{ROOT}")
  return "fake_train"


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


def test_local_cli_dry_run_any_config(tmp_path):
  pytest.importorskip("configs.lm")
  workdir = str(tmp_path / "sweep")
  proc = subprocess.run(
      [sys.executable, "-m", "launch.local", "--config=configs/lm.py:size=xs",
       f"--workdir={workdir}", "--sweep=opt.lr=1e-3,3e-3", "--dry_run",
       "--config.train.steps=7"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  commands = [line for line in proc.stdout.splitlines() if "transformer.train" in line]
  assert len(commands) == 2 and all("--config.train.steps=7" in c for c in commands)
  assert "--config.opt.lr=0.003" in commands[1]
  assert not os.path.exists(workdir)  # nothing ran, nothing written
  proc = subprocess.run(
      [sys.executable, "-m", "launch.local", "--config=configs/lm.py:size=xs",
       f"--workdir={workdir}", "--sweep=opt.lr=1e-3", "--parallel=0"],
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
