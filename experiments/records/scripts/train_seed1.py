"""Train (only) the census language models of seed 1 with the frozen 3d31b68 code, exactly as
experiments.probes.run does before it probes (same config, host setup and train_schemes), so the
distance-matched census control can read them while the other seeds are probed."""
import os
import ml_collections
from experiments.probes import run as pr
from experiments.extrapolation.run import train_schemes


def main(argv):
  del argv
  config = pr.cli.config(pr.FLAGS["config"])
  pr.loop.configure_host(**pr.cli.host_settings())
  schemes = [s for s in str(config.experiment.schemes).split(",") if s]
  lm_config = ml_collections.ConfigDict(config.to_dict())
  train_schemes(lm_config, os.path.join(pr.FLAGS.workdir, "lm"), schemes)


if __name__ == "__main__":
  pr.cli.run(main)
