"""What the command-line programs share: config and flag mistakes reported as one line.

ml_collections raises a mistyped `--config.KEY` or a bad config argument while absl parses
the flags, where absl prints the whole traceback; and a config file that fails to load
raises only when the program first touches it. Every program runs

    app.run(main, flags_parser=cli.parse_flags)

and reads its config flag through `cli.config(flag_holder)`.
"""

from absl import flags


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
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    raise SystemExit(f"error: {one_line(e)}") from None


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
