#!/usr/bin/env bash
# Retrain the head census's language models (frozen 3d31b68, the code that trained the
# published ones) seed by seed, probing each (agreement + census, cached), so their
# checkpoints exist for the distance-matched census control. Resumable.
set -u
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
for seeds in 0 0,1 0,1,2; do  # seed 2 also trains in census_ctl_seed2.sh
  echo "$(date -u) seeds $seeds start"
  /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
    --workdir /work/runs/probes_census/grammar_corpus \
    --config.experiment.seeds=$seeds --config.experiment.census_seeds=$seeds \
    --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
  echo "$(date -u) seeds $seeds rc=$?"
done
