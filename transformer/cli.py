"""What the command-line programs share: config and flag mistakes reported as one line.

ml_collections raises a mistyped `--config.KEY` or a bad config argument while absl parses
the flags, where absl prints the whole traceback; a config file that fails to load raises
only when the program first touches it; and app.UsageError prints a page of usage. Every
program ends with

    cli.run(main, required=("config", "workdir"))

which parses the flags, refuses stray arguments and missing required flags, quiets the
libraries' INFO logging unless --verbosity is given, and turns the user's mistakes (ValueError,
FileNotFoundError, ...) into one `error: ...` line (--verbosity=1 logs the traceback too). A
program reads its config flag through `cli.config(flag_holder)`. Programs that train (the train
command, the experiments) define the train command's flags with `define_train_flags()` when
they are imported as entry points; library modules define no flags.
"""

import os
import signal
import sys
import traceback
from typing import Callable, Sequence

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
# Exceptions that mean the user has something to fix (a config, a path, a flag value), not a
# bug: reported as one line.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError, FloatingPointError, app.UsageError)


def run(main: Callable[[list[str]], None], *, required: Sequence[str] = (),
        positional: bool = False, verbosity: int = logging.WARNING,
        errors: tuple[type[BaseException], ...] = USER_ERRORS) -> None:
  """Run `main` as a program: see the module docstring. `positional`: main takes arguments
  after the flags; `verbosity`: the absl level unless --verbosity is given (the programs'
  output is their own lines; orbax and friends narrate every save at INFO)."""

  def program(argv):
    if len(argv) > 1 and not positional:
      raise SystemExit(f"error: unexpected arguments {argv[1:]} (--help lists the flags)")
    # `present`, not `value`: a config flag's value loads the file (cli.config reports that).
    missing = [f"--{name}" for name in required
               if not FLAGS[name].present and FLAGS[name].default in (None, "")]
    if missing:
      raise SystemExit(f"error: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'}"
                       f" required (--help lists the flags)")
    if not FLAGS["verbosity"].present:
      logging.set_verbosity(verbosity)
    try:
      result = main(argv)
      sys.stdout.flush()  # so that a closed pipe raises here, not in the flush at exit
      return result
    except BrokenPipeError:
      # The reader went away (`| head -3`): stop quietly, as a program killed by SIGPIPE
      # would, with its status; stdout is pointed at /dev/null so the exit's flush is quiet.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      raise SystemExit(128 + signal.SIGPIPE) from None
    except errors as e:
      logging.debug("%s", traceback.format_exc())
      raise SystemExit(f"error: {e}") from None

  app.run(program, flags_parser=parse_flags)


def define_train_flags() -> None:
  """--config, --workdir and the multi-process and host flags of `python -m transformer.train`
  (and of the experiments, which train through it). Defining them twice is a no-op, so an
  experiment may import another that defines them."""
  if "workdir" in FLAGS:
    return
  config_flags.DEFINE_config_file("config", None, "Experiment config file[:args].",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory: logs and checkpoints.")
  flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for multi-process "
                      "runs outside TPU pods and SLURM.")
  flags.DEFINE_integer("num_processes", 0, "Processes in the job.")
  flags.DEFINE_integer("process_id", -1, "This process's index in the job.")
  flags.DEFINE_bool("retain_host_memory", True, "Reuse freed host memory instead of returning "
                    "it to the kernel: faster CPU steps at a higher peak RSS "
                    "(transformer/cpu/host_memory.py; figures in docs/performance.md).")
  flags.DEFINE_integer(
      "cpu_devices", 1, "XLA:CPU devices to split this process's cores into, data-parallel "
      "over the mesh's -1 axis: 1 = one device using every core; 0 = one per core, or the "
      "most the config's mesh and batch divide evenly (docs/performance.md compares them). "
      "Ignored when XLA_FLAGS sets --xla_force_host_platform_device_count; other backends "
      "are unaffected.")


# The programs' path flags. Bash expands ~ only at the start of a word, so `--workdir=~/x`
# arrives as "~/x" (and would make a folder named ~ in the cwd): expanded when the flags are
# parsed.
DIRECTORY_FLAGS = ("workdir", "to", "to_hf", "from", "from_hf", "out", "lm_workdir",
                   "noise_from")


def expand_home(values=FLAGS) -> None:
  """Expand a leading ~ in the directory flags of `values` that are set."""
  for name in DIRECTORY_FLAGS:
    if name in values and isinstance(values[name].value, str) and (
        values[name].value.startswith("~")):
      values[name].value = os.path.expanduser(values[name].value)


def directory(path: str, flag: str = "--workdir") -> str:
  """A directory flag's value, ~ expanded; a file there is refused in one line (before
  makedirs says '[Errno 17] File exists')."""
  path = os.path.expanduser(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag} {path} is a file; give a directory")
  return path


def host_settings() -> dict:
  """The host flags of `define_train_flags()` as `loop.configure_host` keywords."""
  return dict(cpu_devices=FLAGS.cpu_devices, retain_host_memory=FLAGS.retain_host_memory,
              num_processes=FLAGS.num_processes)


def one_line(e: BaseException) -> str:
  """A config-loading exception as one line: ml_collections' messages span several, and its
  unknown-key error is the repr of "'key'\\nDid you mean ...?"."""
  if isinstance(e, (AttributeError, KeyError)) and e.args:
    text = str(e.args[0]).replace("\\n", "\n").replace("\\'", "'").strip("'\"")
    key, *hint = text.split("\n")
    return " ".join([f"unknown config key '{key.strip(chr(39))}';", *hint]).rstrip(";")
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  message = lines[-1] if lines else type(e).__name__
  return message.split("Error: ", 1)[-1] if message.split(":")[0].endswith("Error") else message


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with its errors and ml_collections' as one line ("error: ...")."""
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    raise SystemExit(f"error: {one_line(e)}") from None
  expand_home()
  return rest


def config(flag):
  """The ConfigDict of a config-file flag (None if unset), or exit with one line if the
  file failed to load."""
  try:
    value = flag.value
    if value is not None:
      value.keys()  # a file that failed to load raises only on first use
    return value
  except OSError as e:
    raise SystemExit(f"error: cannot load --config: {one_line(e)}") from None
