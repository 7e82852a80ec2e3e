#!/usr/bin/env bash
# queue.sh: start (or resume) the whole experiment queue on a 2-core machine, from /work/runs
# (after `experiments.records restore`). Every script skips what its records show finished and
# resumes what its checkpoints (or the stash) hold, so running this again after a cut is safe.
#   core 0: T5 bias retrieval seed 0 (trained again for its lost checkpoint), then learned's and none's
#           fourth attempts (scaled embeddings), then RoPE's curriculum (seeds 0-2), then issue 19's
#           final gather (main's code), then the python_stdlib ALiBi LM and its LM-pretrained retrieval model, seeds 1-2
#   core 1: the extended scaling grid and its fit
#   then the grid's ablation on the first core to free up, on both once both are free
set -u
cd /work/runs
nohup taskset -c 0 nice -n 19 ./t5_cap.sh 999999 0 >> t5_cap_seed0.log 2>&1 &
t5=$!
nohup nice -n 19 ./scaled_embeddings.sh "$t5" 0 >> scaled_embeddings.log 2>&1 &
scaled=$!
nohup nice -n 19 ./rope_curriculum.sh "$scaled" 0 >> rope_curriculum.log 2>&1 &
rope=$!
nohup nice -n 19 ./gather19_final.sh "$rope" >> gather19_final.log 2>&1 &
gather=$!
nohup nice -n 19 ./stdlib_seeds.sh "$gather" 0 >> stdlib_seeds.log 2>&1 &
core0=$!
nohup taskset -c 1 nice -n 19 ./scaling_ext.sh 999999 1 1 >> scaling_ext.log 2>&1 &
ext=$!
nohup nice -n 19 ./scaling_ablation_ext.sh "$ext" "$core0" >> scaling_ablation_ext.log 2>&1 &
echo "queue started: t5_cap $t5, scaled_embeddings $scaled, scaling_ext $ext (see /work/runs/*.log)"
