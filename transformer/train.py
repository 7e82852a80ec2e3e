r"""Train a model from an experiment config; re-running the same command resumes.

    python -m transformer.train --config configs/lm.py:size=xs --workdir runs/a \
        [--config.opt.lr=1e-3 ...] [--coordinator_address=host:port --num_processes=N
        --process_id=i]

The job itself is `transformer.training.loop.train_and_evaluate(config, workdir)`.
"""

from transformer.training import preemption

preemption.exit_while_starting()  # before the imports that take seconds

# pylint: disable=g-import-not-at-top,wrong-import-position
from transformer import cli
from transformer.training import loop, sharding

cli.define_train_flags()
FLAGS = cli.FLAGS


def main(argv):
  del argv
  config = cli.config(FLAGS["config"])
  loop.configure_host([config], **cli.host_settings())
  sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                  FLAGS.process_id)
  loop.train_and_evaluate(config, FLAGS.workdir)


def run():
  """The `transformer-train` console script."""
  cli.run(main, required=("config", "workdir"))


if __name__ == "__main__":
  run()
