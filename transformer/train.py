r"""Train a model from an experiment config; re-running the same command resumes.

    python -m transformer.train --config configs/lm.py:size=xs --workdir runs/a \
        [--config.opt.lr=1e-3 ...] [--coordinator_address=host:port --num_processes=N
        --process_id=i]

The job itself is `transformer.training.loop.train_and_evaluate(config, workdir)`.
"""

import traceback

from absl import app, logging

from transformer import cli
from transformer.training import loop, sharding

cli.define_train_flags()
FLAGS = cli.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = cli.config(FLAGS["config"])
  if config is None or not FLAGS.workdir:
    raise app.UsageError("--config and --workdir are required")
  if not FLAGS["verbosity"].present:
    # The progress lines are the console output; orbax and friends log every save at INFO.
    logging.set_verbosity(logging.WARNING)
  try:
    loop.configure_host([config], **cli.host_settings())
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                  FLAGS.process_id)
  try:
    loop.train_and_evaluate(config, FLAGS.workdir)
  except (ValueError, FloatingPointError, FileNotFoundError) as e:
    # Config and data mistakes are the user's to fix: one line; --verbosity=1 adds the trace.
    logging.debug("%s", traceback.format_exc())
    raise SystemExit(f"error: {e}") from None


def run():
  """The `transformer-train` console script."""
  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
