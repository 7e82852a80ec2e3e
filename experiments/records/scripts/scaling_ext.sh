#!/usr/bin/env bash
# scaling_ext.sh WAIT_PID PARALLEL CPUS: wait for WAIT_PID, then issue 18's extended grid
# (configs/scaling.py:design=extended) from the frozen c8de784 on CPUS, the records, the fit.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-c8de784
export PYTHONPATH=/work/frozen-c8de784
W=/work/runs/scaling/grammar_corpus/extended
echo "$(date -u) scaling_ext start (parallel $2, cpus $3)"
taskset -c "$3" /work/main/.venv/bin/python -m launch.local --config configs/scaling.py:design=extended \
  --workdir "$W" --parallel "$2"
echo "$(date -u) scaling_ext grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
/work/main/.venv/bin/python -m experiments.scaling.fit --workdir "$W" --min_layers=2
echo "$(date -u) scaling_ext fit rc=$?"
