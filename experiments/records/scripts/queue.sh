#!/usr/bin/env bash
# queue.sh: start (or resume) the whole experiment queue on a 2-core machine, from /work/runs
# (after `experiments.records restore`). Every script skips what its records show finished and
# resumes what its checkpoints (or the stash) hold, so running this again after a cut is safe.
#   core 0: learned's and none's fourth retrieval attempt (cap3000.sh): none's seeds 0 and 1 and
#           learned's seed 0 again (their checkpoints were lost with a VM before their position
#           curves were evaluated; their runs were moved to /work/old_{none,learned}_records and
#           their records removed on 2026-12-05, so each chain retrains from its first warm-up;
#           learned's finished at 11:10 UTC, its final checkpoint stashed)
#   core 1: RoPE's curriculum (seeds 0-2); the python_stdlib seeds (stdlib_seeds.sh) finished
#           on 2026-12-05 and left the queue
#   then issue 19's final gather (main's code), once cap3000 and RoPE's curriculum are done,
#   with both cores to itself; then the head census over 3 seeds on retrained grammar language
#   models (census_seeds.sh, core 0, ~1.5-2 h)
# (The scaling grids, t5_cap.sh and scaled_embeddings.sh are finished and left the queue.)
set -u
cd /work/runs
# twice: a run whose records lack their checkpoints stops the first at its evaluation (after it
# has trained every chain it could), and the second then trains what the first could not
nohup taskset -c 0 nice -n 19 ./cap3000.sh 999999 0 >> cap3000.log 2>&1 &
nohup taskset -c 0 nice -n 19 ./cap3000.sh $! 0 >> cap3000.log 2>&1 &
cap=$!
nohup nice -n 19 ./rope_curriculum.sh 999999 1 >> rope_curriculum.log 2>&1 &
rope=$!
(while kill -0 "$cap" 2>/dev/null || kill -0 "$rope" 2>/dev/null; do sleep 60; done) &
nohup nice -n 19 ./gather19_final.sh $! >> gather19_final.log 2>&1 &
gather=$!
nohup taskset -c 0 nice -n 19 ./census_seeds.sh $gather 0 >> census_seeds.log 2>&1 &
echo "queue started: cap3000 $cap, rope_curriculum $rope, gather19_final $gather, then census_seeds (see /work/runs/*.log)"
