#!/usr/bin/env bash
# queue.sh: start (or resume) the whole experiment queue on a 2-core machine, from /work/runs
# (after `experiments.records restore`). Every script skips what its records show finished and
# resumes what its checkpoints (or the stash) hold, so running this again after a cut is safe.
#   core 0: learned's and none's fourth retrieval attempt continued to a 3000-step cap, then RoPE's
#           curriculum (seeds 0-2), then issue 19's final gather (main's code), then the
#           python_stdlib ALiBi LM and its LM-pretrained retrieval model, seeds 1-2
#   core 1: the extended scaling grid and its fit (skipped once fit.json exists)
#   then the grid's ablation on the first core to free up, on both once both are free
# (t5_cap.sh and scaled_embeddings.sh finished on 2026-12-04/05 and left the queue.)
set -u
cd /work/runs
nohup taskset -c 0 nice -n 19 ./cap3000.sh 999999 0 >> cap3000.log 2>&1 &
cap=$!
nohup nice -n 19 ./rope_curriculum.sh "$cap" 0 >> rope_curriculum.log 2>&1 &
rope=$!
nohup nice -n 19 ./gather19_final.sh "$rope" >> gather19_final.log 2>&1 &
gather=$!
nohup nice -n 19 ./stdlib_seeds.sh "$gather" 0 >> stdlib_seeds.log 2>&1 &
core0=$!
if [ -f scaling/grammar_corpus/extended/fit.json ]; then
  true &  # the grid and its fit are done: a PID that ends at once, so the ablation takes core 1
else
  nohup taskset -c 1 nice -n 19 ./scaling_ext.sh 999999 1 1 >> scaling_ext.log 2>&1 &
fi
ext=$!
nohup nice -n 19 ./scaling_ablation_ext.sh "$ext" "$core0" >> scaling_ablation_ext.log 2>&1 &
echo "queue started: cap3000 $cap, scaling_ext $ext (see /work/runs/*.log)"
