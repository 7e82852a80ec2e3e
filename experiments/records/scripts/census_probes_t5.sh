#!/usr/bin/env bash
# census_probes_t5.sh CPUS: once census_seeds.sh has trained its last model (t5_bias seed 1),
# probe t5_bias seeds 0-1 on another core while census_seeds.sh probes rope and alibi first
# (its scheme order); it then finds these cached. Nothing trains here. Same frozen code.
set -u
while [ ! -e /work/runs/probes_census/grammar_corpus/lm/runs/t5_bias/seed1/summary.json ]; do sleep 10; done
while pgrep -f census_probes_first.sh > /dev/null; do sleep 10; done
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
echo "$(date -u) census_probes_t5 start (cpus $1)"
taskset -c "$1" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes_census/grammar_corpus --config.experiment.schemes=t5_bias \
  --config.experiment.seeds=0,1 --config.experiment.census_seeds=0,1 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
echo "$(date -u) census_probes_t5 rc=$?"
