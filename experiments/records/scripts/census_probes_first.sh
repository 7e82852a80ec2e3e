#!/usr/bin/env bash
# census_probes_first.sh CPUS: probe seeds 0-1 of the first four schemes (none, sinusoidal,
# sinusoidal_unscaled, learned; all trained by now) on another core while census_seeds.sh trains
# its last models; it then finds these probes cached. Nothing trains here. Same frozen code.
set -u
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
echo "$(date -u) census_probes_first start (cpus $1)"
taskset -c "$1" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes_census/grammar_corpus \
  --config.experiment.schemes=none,sinusoidal,sinusoidal_unscaled,learned \
  --config.experiment.seeds=0,1 --config.experiment.census_seeds=0,1 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
echo "$(date -u) census_probes_first rc=$?"
