#!/usr/bin/env bash
# .gpu/grid.sh: issue 18's scaling runs on the lent GPU, from the frozen code the CPU grids use.
#   1. the extended grid's 1e14 budget (c8de784, 12 runs: the CPU queue's last ~7 hours),
#   2. a control: the extended grid's 1e13 budget again (12 runs the CPU already finished, same
#      seeds and data order), so GPU-vs-CPU differences can be set against the seed spread,
#   3. after 1, the extended ablation (f9b4ebf, 30 runs), as many as the deadline allows.
# Only finished runs come back (summary, metrics, config, log); the CPU launchers skip them and
# rerun the rest from scratch. fp32 everywhere (JAX_DEFAULT_MATMUL_PRECISION=highest: no TF32),
# model.attention=dense (exact attention, the fp32 path every backend has).
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
DEADLINE=${DEADLINE:-500}
SMOKE_STEPS=${SMOKE_STEPS:-300}
G=$PWD/.gpu
OUT=${OUT:-/tmp/out}
W=${GRID_WORK:-/tmp/w}
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
if [ -z "${NO_PIP:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1 || { cat /tmp/pip.log; exit 1; }
fi
SITE=${SITE:-/tmp/site}
export TFDS_DATA_DIR=${TFDS_DATA_DIR:-/tmp/tfds}
D=$TFDS_DATA_DIR/grammar_corpus/large-sentences1-1-maxtokens128/1.0.0
if [ ! -f "$D/dataset_info.json" ]; then
  mkdir -p "$D" /tmp/unpack
  python3 -c "import tarfile; tarfile.open('$G/gc_large.tar.xz').extractall('/tmp/unpack')" || exit 1
  PYTHONPATH=$SITE python3 "$G/rebuild.py" /tmp/unpack/blobs "$D" && cp /tmp/unpack/blobs/*.json "$D/" || exit 1
fi
echo "data ready at $(el) s"
export JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_MEM_FRACTION=0.04
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
PYTHONPATH=$SITE python3 -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__, jax.devices())"

smoke() {  # smoke SITE TAG: a short run of the 1e14 grid's smallest model
  (cd "$G/c8de784" && PYTHONPATH=$1:$G/c8de784 timeout 150 python3 -m transformer.train \
    --config=configs/scaling.py:design=extended --workdir=$W.smoke$2 --config.model.d_model=48 \
    --config.model.num_layers=5 --config.model.num_heads=3 --config.model.num_kv_heads=0 \
    --config.model.head_dim=16 --config.model.d_ff=192 --config.train.steps=$SMOKE_STEPS \
    --config.train.batch_size=64 --config.train.log_every=25 --config.train.eval_every=100 \
    --config.train.checkpoint_every=100 --config.train.eval_batches=13 --config.opt.warmup_steps=18 \
    --config.opt.lr=0.006648 --config.model.attention=dense > $W.smoke$2.log 2>&1)
}
if ! smoke "$SITE" 1; then
  tail -n 20 $W.smoke1.log
  echo "== smoke failed with the image's flax/optax/orbax: the project's pinned ones"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 .whl_pinned/*.whl
  SITE=/tmp/site2:$SITE
  smoke "$SITE" 2 || { tail -n 30 $W.smoke2.log; cp $W.smoke*.log "$OUT/"; exit 1; }
fi
cp $W.smoke*.log "$OUT/" 2>/dev/null
python3 -c "import json,glob; [print('smoke', {k: s[k] for k in ('step','wall_time_s','compile_time_s','final_eval_loss')}) for s in map(lambda p: json.load(open(p)), glob.glob('$W.smoke*/summary.json'))]"
echo "smoke done at $(el) s"

mark() {  # mark CONFIG WORKDIR REGEX: placeholder summaries for the runs whose names do not match
  python3 -m launch.local --config "$1" --workdir "$2" --config.model.attention=dense --dry_run 2>/dev/null \
    | grep -o -- "--workdir=[^ ]*" | sed 's/^--workdir=//' | while read -r d; do
      if ! basename "$d" | grep -qE "$3"; then
        mkdir -p "$d"; echo '{"placeholder": "not run on the GPU"}' > "$d/summary.json"
      fi
    done
}
killgrid() {  # killgrid SIGNAL: every process whose command line holds "$W/" (no pkill needed)
  python3 - "$1" "$W/" <<'EOF2'
import os, signal, sys
sig, pattern = getattr(signal, "SIG" + sys.argv[1]), sys.argv[2]
for pid in filter(str.isdigit, os.listdir("/proc")):
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    if pattern in cmd and int(pid) != os.getpid():
      os.kill(int(pid), sig)
  except (OSError, ProcessLookupError):
    pass
EOF2
}
PIN=taskset; command -v taskset > /dev/null || PIN=""  # taskset -c CPUS, where the image has it
launch() {  # launch TREE DESIGN WORKDIR REGEX CPUS PARALLEL NICE
  (cd "$G/$1" && export PYTHONPATH=$SITE:$G/$1 && mark "configs/scaling.py:design=$2" "$3" "$4" &&
   exec ${PIN:+taskset -c "$5"} nice -n "$7" python3 -m launch.local --config "configs/scaling.py:design=$2" \
     --workdir "$3" --parallel "$6" --config.model.attention=dense) > "$3.launcher.log" 2>&1
}
A=${CPUS_A:-0-11}; B=${CPUS_B:-12-15}
launch c8de784 extended "$W/extended_1e14" 'C=1e14' "$A" 12 0 &
L1=$!
launch c8de784 extended "$W/extended_1e13" 'C=1e13' "$B" 4 5 &
L2=$!
STOP=$W.stop  # set at the deadline: the ablation must not start after it
(while kill -0 $L1 2>/dev/null; do sleep 2; done
 [ -e "$STOP" ] || launch f9b4ebf ablation_extended "$W/ablation_extended" '.' "$A" 12 10) &
L3=$!

last=0
while [ "$(el)" -lt "$DEADLINE" ]; do
  sleep 5
  if ! kill -0 $L2 2>/dev/null && ! kill -0 $L3 2>/dev/null; then break; fi
  if [ $(( $(el) - last )) -ge 30 ]; then
    last=$(el)
    echo "t=$(el)s $(for l in "$W"/*.launcher.log; do echo -n "$(basename "$l" .launcher.log): $(grep -c '^done' "$l") done $(grep -c '^FAILED' "$l") failed; "; done) gpu $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"
  fi
done
echo "stopping at $(el) s"
touch "$STOP"
killgrid TERM; sleep 3; killgrid KILL; sleep 1  # launchers and runs of this grid only
for l in "$W"/*.launcher.log; do echo "== $l"; grep -E "^(done|FAILED)|runs in" "$l" | tail -n 40; done
# Finished runs (no placeholders), every launcher log, and the logs of runs that failed or were cut.
(cd "$W" && python3 - <<'EOF' > /tmp/files.txt
import glob, json, os
for d in sorted(glob.glob("*/*")):
  if not os.path.isdir(d):
    continue
  s = os.path.join(d, "summary.json")
  if os.path.exists(s) and "placeholder" in json.load(open(s)):
    continue
  for f in ("summary.json", "metrics.jsonl", "config.json", "train.log"):
    if os.path.exists(os.path.join(d, f)):
      print(os.path.join(d, f))
for f in glob.glob("*.launcher.log") + glob.glob("*/results.md") + glob.glob("*/sweep.json"):
  print(f)
EOF
tar czf "$OUT/gpu_runs.tgz" -T /tmp/files.txt)
ls -la "$OUT"
echo "end at $(el) s"
