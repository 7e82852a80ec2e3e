"""Every command line's mistakes are one `error:` line, before any compute and before any
file is written; a workdir takes one trainer at a time; a finished run's re-run touches
nothing (issue 23)."""

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import tiny_run

pytestmark = pytest.mark.slow  # subprocesses (conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LM = os.path.join(ROOT, "configs", "lm.py") + ":size=xs"
EXTRAPOLATION = os.path.join(ROOT, "configs", "extrapolation.py") + ":tiny=true"
PROBES = os.path.join(ROOT, "configs", "probes.py") + ":tiny=true"
TRAIN = ["transformer.train", "--config", LM, "--workdir", "w"]


def _cli(cwd, module, *args, env=None, timeout=300):
  env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        cwd=cwd, env=env, timeout=timeout)


def _one_error_line(proc) -> str:
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode != 0, proc.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  return lines[0]


@pytest.mark.parametrize("command,want", [
    # Flags.
    (["transformer.train", "--config", LM], "--workdir is required"),
    (["transformer.train", "--workdir", "w"], "--config is required"),
    (TRAIN + ["stray"], "unexpected arguments ['stray']"),
    (TRAIN + ["--cpu_devices=-1"], "--cpu_devices=-1"),
    (TRAIN + ["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
    # An unreachable coordinator: jax.distributed.initialize would wait minutes, then abort.
    (TRAIN + ["--coordinator_address=host0.invalid:1234", "--num_processes=2",
              "--process_id=0"], "cannot resolve host0.invalid"),
    (TRAIN + ["--coordinator_address=host0", "--num_processes=2", "--process_id=1"],
     "--coordinator_address=host0: give HOST:PORT of process 0"),
    (["transformer.generate", "--prompt", "hi"], "--workdir is required"),
    (["transformer.generate", "--workdir", "w"], "--prompt is required"),
    (["transformer.generate", "--workdir", "w", "--prompt", "hi", "stray"],
     "unexpected arguments ['stray']"),
    (["transformer.generate", "--workdir", "w", "--prompt", "hi", "--no_such_flag"],
     "Unknown command line flag 'no_such_flag'"),
    (["transformer.inspect"], "pass one of --config CONFIG_FILE or --workdir RUN_DIR"),
    (["transformer.inspect", "--config", LM, "stray"], "unexpected arguments ['stray']"),
    (["transformer.inspect", "--config", LM, "--no_such_flag"],
     "Unknown command line flag 'no_such_flag'"),
    (["transformer.convert"], "use --from_hf SRC_DIR --to WORKDIR"),
    (["transformer.convert", "--from", "w", "--to_hf", "out", "stray"],
     "unexpected arguments ['stray']"),
    (["transformer.convert", "--no_such_flag"], "Unknown command line flag 'no_such_flag'"),
    (["launch.local", "--config", LM], "--workdir is required"),
    (["launch.local", "--workdir", "w"], "--config is required"),
    (["launch.local", "--config", LM, "--workdir", "w", "stray"],
     "unexpected arguments ['stray']"),
    (["launch.local", "--config", LM, "--workdir", "w", "--no_such_flag"],
     "Unknown command line flag 'no_such_flag'"),
    # Swept values of the wrong type: refused before any run (or the sweep folder) is made.
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=opt.lr=1e-3,abc"],
     "sweep value 'abc' for opt.lr is not a float (the config has"),
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=model.num_layers=2,2.5"],
     "sweep value 2.5 for model.num_layers is not an int"),
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=train.async_checkpoint=maybe"],
     "sweep value 'maybe' for train.async_checkpoint is not a bool"),
    (["launch.local", "--config", LM, "--workdir", "w", "--trials=2",
      "--sweep=model.num_layers=uniform(1,8)"], "for model.num_layers is not an int"),
    # ... or of the right type but wrong for the model: refused before the first run trains.
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=model.num_heads=2,3"],
     "run num_heads=3: model.d_model=64 is not divisible by model.num_heads=3"),
    # Config values the trainer refuses in check_config, before anything is built.
    (TRAIN + ["--config.train.eval_batches=0"], "train.eval_batches must be >= 1, got 0"),
    (TRAIN + ["--config.opt.lr=-0.001"], "opt.lr must be a finite number >= 0, got -0.001"),
    (TRAIN + ["--config.opt.lr=nan"], "opt.lr must be a finite number >= 0, got nan"),
    (TRAIN + ["--config.opt.warmup_steps=-1"], "opt.warmup_steps must be >= 0, got -1"),
    (TRAIN + ["--config.train.keep_checkpoints=0", "--config.train.keep_best=0"],
     "train.keep_checkpoints=0 with train.keep_best=0 keeps no checkpoint"),
    (TRAIN + ["--config.train.data_shards=-1"], "train.data_shards must be >= 0"),
    (TRAIN + ["--config.opt.grad_accum_steps=2", "--config.train.batch_size=5"],
     "train.batch_size=5 is not divisible by opt.grad_accum_steps=2"),
    # The same for a swept batch: refused before the sweep's first run trains.
    (["launch.local", "--config", LM, "--workdir", "w", "--config.opt.grad_accum_steps=2",
      "--sweep=train.batch_size=16,5"],
     "run batch_size=5: train.batch_size=5 is not divisible by opt.grad_accum_steps=2"),
    (["launch.local", "--config", LM, "--workdir", "w", "--trials=2",
      "--sweep=opt.lr=loguniform(1e-2,1e-4)"], "low 0.01 is above high 0.0001"),
    (["launch.local", "--config", LM, "--workdir", "w", "--trials=2",
      "--sweep=opt.lr=loguniform(-1,1e-4)"], "loguniform needs 0 < low <= high"),
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=opt.lr=1e-3;opt.lr=2e-3"],
     "sweep key opt.lr is on two axes"),
    (["launch.local", "--config", LM, "--workdir", "w", "--sweep=opt.lr=1e-3,2e-3",
      "--sweep_seed=1"], "--sweep_seed seeds a random search: give --trials and --sweep too"),
    # A mistyped path to the language models would train them all there.
    (["experiments.probes.run", "--config", PROBES, "--workdir", "w",
      "--config.experiment.lm_workdir=nowhere"],
     "experiment.lm_workdir=nowhere is not a directory: give the extrapolation experiment's"),
    # The analysis commands: a wrong path is one line, and no table header is printed first.
    (["experiments.probes.embeddings", "nowhere"], "no checkpoint under nowhere/checkpoints"),
    (["experiments.scaling.eval_noise", "nowhere"], "nowhere: no finished run with two"),
    (["experiments.probes.replication", "--published", "a.json", "--replica", "b.json"],
     "--published=a.json: cannot read it as JSON"),
    (["experiments.probes.replication", "--published", "a.json"], "--replica is required"),
    (["experiments.scaling.estimate"], "--config is required (e.g. --config configs/scaling.py"),
    (["experiments.scaling.lr_law", "--workdir", "nowhere"],
     "nowhere/sweep.json not found; --workdir takes the directory of the design=lr_sweep"),
], ids=lambda v: " ".join(a.replace(LM, "LM") for a in v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, command, want):
  proc = _cli(tmp_path, *command)
  line = _one_error_line(proc)
  assert want in line, line
  assert proc.stdout == "", proc.stdout
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("line,program,want", [
    ("config.data.seqlen = 128", "transformer.train",
     "unknown config key data.seqlen, which nothing reads; did you mean data.seq_len?"),
    ("config.model.position.thetta = 1e4", "launch.local",
     "unknown config key model.position.thetta, which nothing reads; did you mean "
     "model.position.theta?"),
    ("config.trian = config.train", "transformer.train",
     "unknown config block 'trian'; did you mean train?"),
])
def test_a_typo_inside_a_config_file_is_one_line(tmp_path, line, program, want):
  """A key set in a config file (not on the command line, which ml_collections checks) that
  nothing reads: the run would silently train with the default."""
  (tmp_path / "typo.py").write_text("from configs import lm\n\n\ndef get_config():\n"
                                    f"  config = lm.get_config('size=xs')\n  {line}\n"
                                    "  return config\n")
  extra = ["--sweep=opt.lr=1e-3", "--dry_run"] if program == "launch.local" else []
  proc = _cli(tmp_path, program, "--config", "typo.py", "--workdir", "w", *extra)
  assert want in _one_error_line(proc)
  assert os.listdir(tmp_path) == ["typo.py"]


@pytest.mark.parametrize("command", [
    ["launch.local", "--config", LM, "--sweep=opt.lr=1e-3", "--workdir", "afile"],
    ["experiments.extrapolation.run", "--config", EXTRAPOLATION, "--workdir", "afile"],
    ["experiments.probes.run", "--config", PROBES, "--workdir", "afile"],
    ["experiments.records", "save", "runs", "afile"],
    ["experiments.records", "save", "runs", "afile/sub"],
], ids=lambda v: " ".join(v[:1] + v[-1:]))
def test_a_file_where_a_directory_goes_is_one_line(tmp_path, command):
  (tmp_path / "afile").write_text("the user's")
  (tmp_path / "runs" / "r1").mkdir(parents=True)
  (tmp_path / "runs" / "r1" / "summary.json").write_text("{}")  # a record to save
  proc = _cli(tmp_path, *command)
  line = _one_error_line(proc)
  assert "is a file; give a directory" in line or "Not a directory" in line, line
  assert sorted(os.listdir(tmp_path)) == ["afile", "runs"]
  assert (tmp_path / "afile").read_text() == "the user's"


# The tiny run of tests/helpers/tiny_run.py, as the train command's flags.
def _tiny_flags(data_dir, steps):
  config = tiny_run.tiny_config(data_dir, **{"train.steps": steps})
  return ["--config", LM, f"--config.data.size={config.data.size}",
          f"--config.data.data_dir={data_dir}",
          f"--config.data.seq_len={config.data.seq_len}",
          f"--config.model.max_len={config.model.max_len}",
          *(f"--config.train.{k}={config.train[k]}" for k in (
              "steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
              "eval_batches", "peak_flops")),
          f"--config.opt.warmup_steps={config.opt.warmup_steps}",
          f"--config.opt.lr={config.opt.lr}"]


def _snapshot(workdir) -> dict:
  """{relative path: (mtime_ns, bytes)} of every file (folders' mtimes move: the trainer's
  write probe)."""
  out = {}
  for parent, dirs, files in os.walk(workdir):
    for name in files:
      path = os.path.join(parent, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = (os.stat(path).st_mtime_ns, f.read())
  return out


@pytest.fixture(scope="module")
def two_launches(tmp_path_factory, data_dir):
  """A tiny run held inside its loop while a second trainer is launched on its workdir;
  then released to finish. Returns (workdir, the second launch, the first's output)."""
  base = tmp_path_factory.mktemp("two_launches")
  workdir, go = base / "run", base / "go"
  env = dict(os.environ)  # with the session's compilation cache (conftest.py)
  first = subprocess.Popen(
      [sys.executable, os.path.join(HERE, "helpers", "tiny_run.py"), "--workdir", str(workdir),
       "--data_dir", data_dir, "--set", "train.steps=3", "--wait_for", str(go)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
  try:
    lock = workdir / ".lock"
    deadline = time.time() + 600
    while not (lock.exists() and lock.read_text().startswith("pid ")):
      assert first.poll() is None and time.time() < deadline, first.communicate()
      time.sleep(0.2)
    second = _cli(base, "transformer.train", "--workdir", str(workdir),
                  *_tiny_flags(data_dir, 3), env=env)
  finally:
    go.touch()
  out, err = first.communicate(timeout=600)
  assert first.returncode == 0, err[-3000:]
  return workdir, second, json.loads(out.strip().splitlines()[-1]), env


def test_a_second_launch_on_a_locked_workdir_is_refused_naming_the_holder(two_launches):
  workdir, second, first, _ = two_launches
  line = _one_error_line(second)
  want = f"error: {workdir} is in use by another trainer (last recorded: pid "
  assert line.startswith(want), line
  assert first["summary"]["step"] == 3 and sorted(first["losses"]) == ["1", "2", "3"]


def test_rerunning_a_finished_run_touches_nothing(two_launches, data_dir):
  workdir, _, first, env = two_launches
  before = _snapshot(workdir)
  proc = _cli(workdir.parent, "transformer.train", "--workdir", str(workdir),
              *_tiny_flags(data_dir, 3), env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"{workdir} is finished: 3 steps" in proc.stdout
  assert _snapshot(workdir) == before


def test_train_steps_below_the_checkpoint_is_refused_before_writing(two_launches, data_dir):
  workdir, _, _, env = two_launches
  before = _snapshot(workdir)
  proc = _cli(workdir.parent, "transformer.train", "--workdir", str(workdir),
              *_tiny_flags(data_dir, 2), env=env)
  line = _one_error_line(proc)
  assert "holds a checkpoint of step 3, past train.steps=2" in line, line
  assert _snapshot(workdir) == before
