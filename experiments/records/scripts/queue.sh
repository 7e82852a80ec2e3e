#!/usr/bin/env bash
# queue.sh: start (or resume) the whole experiment queue on a 2-core machine, from /work/runs
# (after `experiments.records restore`). Every script skips what its records show finished and
# resumes what its checkpoints (or the stash) hold, so running this again after a cut is safe.
#   core 0: none's fourth retrieval attempt, seed 2 (cap3000.sh)
#   core 1: the extended scaling grid's fit (skipped once fit.json exists)
#   then the grid's ablation (its last 1e14 runs) on core 1, on both cores once cap3000.sh ends
#   then core 0: RoPE's curriculum (seeds 0-2), then issue 19's final gather (main's code);
#        core 1: the python_stdlib ALiBi LM and its LM-pretrained retrieval model, seeds 1-2
# (Since 2026-12-05 06:20 the ablation comes before RoPE's curriculum, so that one of the two
# finishes within a session; t5_cap.sh and scaled_embeddings.sh finished on 2026-12-04/05.)
set -u
cd /work/runs
nohup taskset -c 0 nice -n 19 ./cap3000.sh 999999 0 >> cap3000.log 2>&1 &
cap=$!
if [ -f scaling/grammar_corpus/extended/fit.json ]; then
  true &  # the grid and its fit are done: a PID that ends at once, so the ablation takes core 1
else
  nohup taskset -c 1 nice -n 19 ./scaling_ext.sh 999999 1 1 >> scaling_ext.log 2>&1 &
fi
ext=$!
nohup nice -n 19 ./scaling_ablation_ext.sh "$ext" "$cap" >> scaling_ablation_ext.log 2>&1 &
abl=$!
nohup nice -n 19 ./rope_curriculum.sh "$abl" 0 >> rope_curriculum.log 2>&1 &
rope=$!
nohup nice -n 19 ./gather19_final.sh "$rope" >> gather19_final.log 2>&1 &
nohup nice -n 19 ./stdlib_seeds.sh "$abl" 1 >> stdlib_seeds.log 2>&1 &
echo "queue started: cap3000 $cap, scaling_ext $ext, ablation $abl (see /work/runs/*.log)"
