#!/usr/bin/env bash
# Seed 2 of census_ctl.sh, side by side with it (its own run directories). Resumable.
set -u
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
echo "$(date -u) seed 2 start"
/work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes_census/grammar_corpus \
  --config.experiment.seeds=2 --config.experiment.census_seeds=2 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
echo "$(date -u) seed 2 rc=$?"
