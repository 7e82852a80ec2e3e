#!/usr/bin/env bash
# stdlib_seeds.sh WAIT_PID CPUS: wait for WAIT_PID, then the python_stdlib ALiBi language model and
# its LM-pretrained retrieval model for seeds 1 and 2 (seed 0 is finished and cached), with the
# command and frozen code (2e088a6) that trained seed 0; then save the records under the lock.
# (Until 2026-12-05 08:25 it lacked kv_seeds=0,1,2, so its first run trained the language models
# of seeds 1-2 and probed them, but trained the LM-pretrained retrieval model of seed 0 only.)
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-2e088a6
export PYTHONPATH=/work/frozen-2e088a6
echo "$(date -u) stdlib_seeds start (cpus $2)"
taskset -c "$2" /work/main/.venv/bin/python -m experiments.probes.run \
  --config configs/probes.py:dataset=python_stdlib --workdir /work/runs/probes_stdlib/python_stdlib \
  --config.experiment.lm_workdir=/work/runs/extrapolation/python_stdlib \
  --config.experiment.schemes=alibi --config.experiment.seeds=0,1,2 \
  --config.experiment.kv_schemes= --config.experiment.kv_pretrained_schemes=alibi \
  --config.experiment.kv_seeds=0,1,2
echo "$(date -u) stdlib_seeds rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
