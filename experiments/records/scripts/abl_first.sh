#!/usr/bin/env bash
# abl_first.sh CAP_PID NONE_PID (a one-off, 2026-12-05): run the extended ablation's last runs on
# both cores before none's seed 2 finishes. NONE_PID (cap3000.sh's probes.run, core 0) has been
# stopped with SIGSTOP and the ablation restarted two at a time (scaling_ablation_ext.sh with
# dead wait PIDs); this waits for the ablation's launcher to end, resumes NONE_PID (SIGCONT),
# then starts the python_stdlib seeds on core 1 and RoPE's curriculum on core 0 after CAP_PID,
# and issue 19's final gather after RoPE's curriculum, as queue.sh orders them.
set -u
cd /work/runs
sleep 120  # the restarted launcher's start
while pgrep -f "launch.local --config configs/scaling.py:design=ablation_extended" > /dev/null; do
  sleep 60
done
echo "$(date -u) abl_first: ablation grid done, resuming $2"
kill -CONT "$2"
nohup nice -n 19 ./stdlib_seeds.sh 999999 1 >> stdlib_seeds.log 2>&1 &
nohup nice -n 19 ./rope_curriculum.sh "$1" 0 >> rope_curriculum.log 2>&1 &
rope=$!
nohup nice -n 19 ./gather19_final.sh "$rope" >> gather19_final.log 2>&1 &
wait
