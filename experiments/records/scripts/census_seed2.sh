#!/usr/bin/env bash
# census_seed2.sh CPUS: census_seeds.sh's seed 2 alone (frozen 3d31b68), on another core, so the
# three seeds' language models train two at a time. census_seeds.sh trains seeds 0 and 1 first
# (seed-major order), then finds seed 2's models finished and its probes cached, and skips them.
# Its maps (census seed 2 here) are cached but unused. Resumable like census_seeds.sh.
set -u
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
echo "$(date -u) census_seed2 start (cpus $1)"
taskset -c "$1" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes_census/grammar_corpus \
  --config.experiment.seeds=2 --config.experiment.census_seeds=2 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
echo "$(date -u) census_seed2 rc=$?"
