"""Config and flag mistakes on any command line are one line, from the real exceptions."""

import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from transformer import cli

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse_error(*args, config="configs/lm.py:size=xs") -> BaseException:
  argv = ["prog", f"--config={os.path.join(ROOT, config)}", *args]
  values = flags.FlagValues()
  # The override flags are defined from the argv (sys.argv by default) when parsing.
  config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
  try:
    values(argv)
    values["config"].value.keys()
  except Exception as e:  # pylint: disable=broad-except
    return e
  raise AssertionError("no error")


@pytest.mark.parametrize("args,config,want", [
    (["--config.train.stpes=3"], "configs/lm.py:size=xs",
     "unknown config key 'stpes'; Did you mean \"steps\" instead of \"stpes\"?"),
    (["--config.nothing_like_it=3"], "configs/lm.py:size=xs",
     "unknown config key 'nothing_like_it'"),
    (["--config.train.steps=abc"], "configs/lm.py:size=xs",
     "flag --config.train.steps=abc: invalid literal for int() with base 10: 'abc'"),
    ([], "configs/lm.py:size=xxs", "unknown size 'xxs'; valid: ['xs', 's', 'm', 'l', 'xl']"),
    ([], "configs/nope.py", "[Errno 2] No such file or directory: "),
])
def test_config_mistakes_become_one_line(args, config, want):
  message = cli.one_line(_parse_error(*args, config=config))
  assert "\n" not in message and message.startswith(want), message


def test_a_program_reports_a_typo_in_one_line():
  proc = subprocess.run([sys.executable, "-m", "transformer.inspect", "--config",
                         "configs/arch/gpt2_small.py", "--config.model.num_layer=3"],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: unknown config key 'num_layer'; Did you mean \"num_layers\" instead of "
      "\"num_layer\"?"]


def test_a_directory_flag_expands_a_leading_tilde(monkeypatch, tmp_path):
  """Bash leaves ~ unexpanded after `=`: `--workdir=~/x` would make a folder named ~ here."""
  monkeypatch.setenv("HOME", str(tmp_path))
  values = flags.FlagValues()
  for name in ("workdir", "to_hf", "out", "prompt"):
    flags.DEFINE_string(name, None, "", flag_values=values)
  values(["prog", "--workdir=~/runs/a", "--to_hf=~", "--out=~/tables", "--prompt=~/not a path"])
  cli.expand_home(values)
  assert values.workdir == f"{tmp_path}/runs/a" and values.to_hf == str(tmp_path)
  assert values.out == f"{tmp_path}/tables" and values.prompt == "~/not a path"
  assert cli.directory("~/runs/b") == f"{tmp_path}/runs/b"
  from transformer.training import init_from  # --config.train.init_from=~/runs/a:40
  assert init_from.parse("~/runs/a:40") == (f"{tmp_path}/runs/a", 40)


def test_a_reader_that_stops_early_ends_the_program_quietly():
  """`python -m transformer.inspect ... | head -3`: the reader closes the pipe before the
  report is written; the program stops with SIGPIPE's status and no BrokenPipeError
  traceback (it printed one in about a third of tries)."""
  read, write = os.pipe()
  os.close(read)  # the reader is gone before the first write: deterministic
  proc = subprocess.run([sys.executable, "-m", "transformer.inspect", "--config",
                         "configs/arch/gpt2_small.py"], stdout=write, stderr=subprocess.PIPE,
                        text=True, cwd=ROOT, timeout=300)
  os.close(write)
  assert proc.returncode == 141 and proc.stderr == "", proc.stderr[-2000:]
