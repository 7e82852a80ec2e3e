#!/usr/bin/env bash
# Every committed experiment result, in order of priority, but two: the python_stdlib probes
# and the head census on retrained models (experiments/probes/results/python_stdlib and
# grammar_corpus_census). Their results.md hold hand-written provenance (and the census the
# replication's table) that `publish` would overwrite; each gives its command at its end, and
# both rebuild their numbers from the records alone (checked on a fresh checkout, 2026-12-07).
# Re-running resumes where it stopped: finished runs are skipped, interrupted ones resume from
# their checkpoints. Runs live under $RUNS (default runs/experiments, or anything that
# survives); each step then copies its results (the JSON, markdown and PNG files at the top of
# its workdir, never the runs) into experiments/<name>/results/<corpus>/, which is what gets
# committed.
#
#   RUNS=/work/runs nohup nice -n 19 experiments/run_all.sh > run_all.log 2>&1 &
#
# Run it from a frozen copy of the code (git worktree add ../frozen <commit>) so that edits
# to the checkout never change a sweep midway; the step lines below say when each started.
#
# The sweep outlives its machine through its records (experiments/records.py): after every
# finished unit of work the runs' summaries, configs and cached evaluations are copied to
# $RECORDS (default experiments/records; commit them), and a start on a new machine first
# restores them into $RUNS, so every finished run is skipped and never loaded. Keep $RUNS and
# the frozen commit the same across machines: a finished run is checked against the config
# that trained it. The language models are probed one at a time, right after each trains, so
# nothing needs a checkpoint that the machine may not keep.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
RUNS=${RUNS:-runs/experiments}
RECORDS=${RECORDS:-experiments/records}
R=experiments

step() { echo "== $(date -u +%FT%TZ) $*"; }
publish() {  # publish WORKDIR DEST [PREFIX]: the workdir's result files, renamed PREFIX*
  mkdir -p "$2"
  for f in "$1"/*.json "$1"/*.md "$1"/*.png; do
    [ -f "$f" ] && cp "$f" "$2/${3:-}$(basename "$f")"
  done
}
save() { mkdir -p "$RUNS"; $PY -m experiments.records save "$RUNS" "$RECORDS"; }
# Build a dataset once before parallel runs read it (two runs building it at once would race).
prepare() { $PY -c "from configs import scaling; from transformer import data
data.describe(scaling.get_config('$1').data)" > /dev/null; }

[ -d "$RECORDS" ] && mkdir -p "$RUNS" && $PY -m experiments.records restore "$RECORDS" "$RUNS"

# Extrapolation and probes (issue 19), grammar_corpus, one trained model at a time: each
# language model is evaluated and probed as soon as it is trained (and, for the
# kv_pretrained_schemes' first seed, its LM-pretrained retrieval model trained from it); every
# scheme's first seed first, then the other seeds, then the retrieval models. The results
# steps train nothing: they gather every run's records.
E=$RUNS/extrapolation/grammar_corpus
P=$RUNS/probes/grammar_corpus
SCHEMES="none sinusoidal sinusoidal_unscaled learned rope alibi t5_bias"  # configs/extrapolation.py
KV_SCHEMES="none sinusoidal learned rope alibi t5_bias"  # configs/probes.py kv_schemes
PRETRAINED=" rope alibi none "  # configs/probes.py kv_pretrained_schemes
# The retrieval attempts the committed results trained (their results.md's command), which
# differ from configs/probes.py's defaults: a third attempt for none and learned, RoPE's and
# T5's own caps, and the LM-pretrained runs' lr retry only (they stopped there when the
# curriculum was added). With the defaults, a restored sweep would train attempts the records
# never had, and the LM-pretrained ones need checkpoints the records do not keep.
LR="opt.lr=3e-4;opt.warmup_steps=500"
CURRICULUM="kv_warm_pairs=2,4,8,16"
THIRD="model.scale_embeddings=True;$CURRICULUM;kv_max_steps=3000"
KV_RETRY=(
  "--config.experiment.kv_retry.learned=$LR | $CURRICULUM | $THIRD"
  "--config.experiment.kv_retry.none=$LR | $CURRICULUM | $THIRD"
  "--config.experiment.kv_retry.rope=$LR;kv_max_steps=3000 | $CURRICULUM;kv_max_steps=3000"
  "--config.experiment.kv_retry.t5_bias=$LR | $CURRICULUM;kv_max_steps=3000"
  "--config.experiment.kv_retry.sinusoidal_unscaled=$LR"
  "--config.experiment.kv_pretrained_retry.alibi=$LR"
  "--config.experiment.kv_pretrained_retry.none=$LR"
  "--config.experiment.kv_pretrained_retry.rope=$LR;kv_max_steps=3000"
)
language_model() {  # language_model SCHEME SEED
  step "extrapolation and probes: $1 seed $2"
  $PY -m experiments.extrapolation.run --config configs/extrapolation.py --workdir "$E" \
      --config.experiment.schemes="$1" --config.experiment.seeds="$2"
  local pretrained=""
  [[ "$2" == 0 && "$PRETRAINED" == *" $1 "* ]] && pretrained=$1
  $PY -m experiments.probes.run --config configs/probes.py --workdir "$P" "${KV_RETRY[@]}" \
      --config.experiment.lm_workdir="$E" --config.experiment.schemes="$1" \
      --config.experiment.seeds="$2" --config.experiment.kv_schemes= \
      --config.experiment.kv_pretrained_schemes="$pretrained"
  save
}
for scheme in $SCHEMES; do language_model "$scheme" 0; done
for seed in 1 2; do for scheme in $SCHEMES; do language_model "$scheme" "$seed"; done; done
step "extrapolation: results"  # trains nothing: gathers the runs' records
$PY -m experiments.extrapolation.run --config configs/extrapolation.py --workdir "$E"
publish "$E" "$R/extrapolation/results/grammar_corpus"
for scheme in $KV_SCHEMES; do
  step "retrieval model: $scheme"
  $PY -m experiments.probes.run --config configs/probes.py --workdir "$P" "${KV_RETRY[@]}" \
      --config.experiment.lm_workdir="$E" --config.experiment.schemes="$scheme" \
      --config.experiment.seeds=0 --config.experiment.kv_schemes="$scheme" \
      --config.experiment.kv_pretrained_schemes=
  save
done
step "probes: results"  # trains nothing either
$PY -m experiments.probes.run --config configs/probes.py --workdir "$P" "${KV_RETRY[@]}" \
    --config.experiment.lm_workdir="$E"
publish "$P" "$R/probes/results/grammar_corpus"
save

# Scaling (issue 18), grammar_corpus: learning rates per size, then the corrected IsoFLOP grid.
S=$RUNS/scaling/grammar_corpus
OUT=$R/scaling/results/grammar_corpus
prepare design=corrected
step scaling lr sweep
$PY -m launch.local --config configs/scaling.py:design=lr_sweep --workdir "$S/lr_sweep" --parallel 2
save
$PY -m experiments.scaling.lr_law --workdir "$S/lr_sweep"
publish "$S/lr_sweep" "$OUT" lr_sweep_
step scaling corrected grid
$PY -m launch.local --config configs/scaling.py:design=corrected --workdir "$S/corrected" \
    --parallel 2 --config.sweep.lr_law="$S/lr_sweep/lr_law.json"
save
$PY -m experiments.scaling.fit --workdir "$S/corrected" --min_layers 2
publish "$S/corrected" "$OUT"
# The lr law's exponent interval needs the seed noise this grid has just measured (the same
# law, now with its 95% interval; the grids below read the same coef and exponent).
$PY -m experiments.scaling.lr_law --workdir "$S/lr_sweep" --noise_from "$S/corrected/fit.json"
publish "$S/lr_sweep" "$OUT" lr_sweep_

# The ablation: the grid with the old settings, then Porian et al.'s corrections one at a time.
for design in ablation ablation_flops ablation_warmup; do
  step scaling $design
  $PY -m launch.local --config configs/scaling.py:design=$design --workdir "$S/$design" --parallel 2
  save
done
$PY -m experiments.scaling.ablation --out "$OUT" \
    "$S/ablation" "$S/ablation_flops" "$S/ablation_warmup" "$S/corrected"

# The extended grid (1e12-1e14, so every minimum can have two sizes on each side), its deep
# variant (>= 3 layers), the deep grid with every size of each budget's window, and the two
# ablations (the original settings on the extended and the deep grids' models). Each derived
# grid first copies the finished runs its design leaves unchanged (checked against their
# configs), then trains the rest.
derive() {  # derive FROM TO: copy FROM's runs that TO's design leaves unchanged
  PYTHONPATH=. $PY experiments/records/scripts/copy_unchanged_runs.py "$1" "$2" "$S/$1" "$S/$2"
}
table() {  # table ABLATION GRID: the ablation table, published as ABLATION.{md,json,png}
  $PY -m experiments.scaling.ablation --out "$S/$1/table" "$S/$1" "$S/$2"
  for f in "$S/$1/table"/ablation.*; do cp "$f" "$OUT/$1.${f##*.}"; done
}
for design in extended extended_deep extended_deep_window ablation_extended ablation_extended_deep; do
  step scaling $design
  case $design in
    extended_deep) derive extended extended_deep ;;
    extended_deep_window) derive extended_deep extended_deep_window ;;
    ablation_extended_deep) derive ablation_extended ablation_extended_deep ;;
  esac
  $PY -m launch.local --config configs/scaling.py:design=$design --workdir "$S/$design" --parallel 2
  save
  $PY -m experiments.scaling.fit --workdir "$S/$design" --min_layers 2 --bootstrap 1000
  publish "$S/$design" "$OUT" "${design}_"
done
table ablation_extended extended
table ablation_extended_deep extended_deep

# python_stdlib: a consistency check at the budgets it can feed (<= 4 epochs), and extrapolation.
step scaling python_stdlib
$PY -m launch.local --config configs/scaling.py:design=stdlib --workdir "$RUNS/scaling/python_stdlib" \
    --parallel 2 --config.sweep.lr_law="$S/lr_sweep/lr_law.json"
save
$PY -m experiments.scaling.fit --workdir "$RUNS/scaling/python_stdlib" --min_layers 2
publish "$RUNS/scaling/python_stdlib" "$R/scaling/results/python_stdlib"
step extrapolation python_stdlib
$PY -m experiments.extrapolation.run --config configs/extrapolation.py:dataset=python_stdlib \
    --workdir "$RUNS/extrapolation/python_stdlib"
publish "$RUNS/extrapolation/python_stdlib" "$R/extrapolation/results/python_stdlib"
save
step done
