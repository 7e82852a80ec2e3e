#!/usr/bin/env bash
# census_seeds.sh WAIT_PID CPUS: wait for WAIT_PID, then issue 19's head census over 3 seeds
# (frozen 3d31b68). The grammar_corpus language models' checkpoints were lost with a VM after
# their agreement probes and seed 0's census were cached, so every scheme's seeds 0-2 train again
# here, in their own directory (the originals' records stay as they are), and are probed:
# the census of every seed, and agreement again (a replication of the published numbers on the
# retrained models). No retrieval models. Resumable: finished runs and cached probes are skipped.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-3d31b68
export PYTHONPATH=/work/frozen-3d31b68
echo "$(date -u) census_seeds start (cpus $2)"
taskset -c "$2" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes_census/grammar_corpus \
  --config.experiment.seeds=0,1,2 --config.experiment.census_seeds=0,1,2 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=
echo "$(date -u) census_seeds rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
