#!/usr/bin/env bash
# Every committed experiment result, in order of priority. Re-running resumes where it stopped:
# finished runs are skipped, interrupted ones resume from their checkpoints. Runs live under
# $RUNS (default runs/experiments, or anything that survives); each step then copies its
# results (the JSON, markdown and PNG files at the top of its workdir, never the runs) into
# experiments/<name>/results/<corpus>/, which is what gets committed.
#
#   RUNS=/work/runs nohup nice -n 19 experiments/run_all.sh > run_all.log 2>&1 &
#
# Run it from a frozen copy of the code (git worktree add ../frozen <commit>) so that edits
# to the checkout never change a sweep midway; the step lines below say when each started.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
RUNS=${RUNS:-runs/experiments}
R=experiments

step() { echo "== $(date -u +%FT%TZ) $*"; }
publish() {  # publish WORKDIR DEST [PREFIX]: the workdir's result files, renamed PREFIX*
  mkdir -p "$2"
  for f in "$1"/*.json "$1"/*.md "$1"/*.png; do
    [ -f "$f" ] && cp "$f" "$2/${3:-}$(basename "$f")"
  done
}
# Build a dataset once before parallel runs read it (two runs building it at once would race).
prepare() { $PY -c "from configs import scaling; from transformer import data
data.describe(scaling.get_config('$1').data)" > /dev/null; }

# Scaling (issue 18), grammar_corpus: learning rates per size, then the corrected IsoFLOP grid.
S=$RUNS/scaling/grammar_corpus
OUT=$R/scaling/results/grammar_corpus
prepare design=corrected
step scaling lr sweep
$PY -m launch.local --config configs/scaling.py:design=lr_sweep --workdir "$S/lr_sweep" --parallel 2
$PY -m experiments.scaling.lr_law --workdir "$S/lr_sweep"
publish "$S/lr_sweep" "$OUT" lr_sweep_
step scaling corrected grid
$PY -m launch.local --config configs/scaling.py:design=corrected --workdir "$S/corrected" \
    --parallel 2 --config.sweep.lr_law="$S/lr_sweep/lr_law.json"
$PY -m experiments.scaling.fit --workdir "$S/corrected" --min_layers 2
publish "$S/corrected" "$OUT"

# Extrapolation and probes (issue 19), grammar_corpus.
step extrapolation grammar_corpus
$PY -m experiments.extrapolation.run --config configs/extrapolation.py \
    --workdir "$RUNS/extrapolation/grammar_corpus"
publish "$RUNS/extrapolation/grammar_corpus" "$R/extrapolation/results/grammar_corpus"
# The probes reuse the extrapolation's language models; their retrieval models (every scheme,
# and the LM-pretrained ones: train.init_from those LMs) train to the stated criterion here.
step probes grammar_corpus
$PY -m experiments.probes.run --config configs/probes.py \
    --workdir "$RUNS/probes/grammar_corpus" \
    --config.experiment.lm_workdir="$RUNS/extrapolation/grammar_corpus"
publish "$RUNS/probes/grammar_corpus" "$R/probes/results/grammar_corpus"

# The ablation: the grid with the old settings, then Porian et al.'s corrections one at a time.
for design in ablation ablation_flops ablation_warmup; do
  step scaling $design
  $PY -m launch.local --config configs/scaling.py:design=$design --workdir "$S/$design" --parallel 2
done
$PY -m experiments.scaling.ablation --out "$OUT" \
    "$S/ablation" "$S/ablation_flops" "$S/ablation_warmup" "$S/corrected"

# python_stdlib: a consistency check at the budgets it can feed (<= 4 epochs), and extrapolation.
step scaling python_stdlib
$PY -m launch.local --config configs/scaling.py:design=stdlib --workdir "$RUNS/scaling/python_stdlib" \
    --parallel 2 --config.sweep.lr_law="$S/lr_sweep/lr_law.json"
$PY -m experiments.scaling.fit --workdir "$RUNS/scaling/python_stdlib" --min_layers 2
publish "$RUNS/scaling/python_stdlib" "$R/scaling/results/python_stdlib"
step extrapolation python_stdlib
$PY -m experiments.extrapolation.run --config configs/extrapolation.py:dataset=python_stdlib \
    --workdir "$RUNS/extrapolation/python_stdlib"
publish "$RUNS/extrapolation/python_stdlib" "$R/extrapolation/results/python_stdlib"
step done
