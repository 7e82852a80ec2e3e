#!/bin/bash
# Run a sweep on a Cloud TPU VM slice: every run uses all hosts of the slice, one run at a time.
#
#   launch/tpu_vm.sh TPU_NAME ZONE --config configs/scaling.py --workdir /mnt/shared/scaling \
#       [--config.KEY=VALUE ...] [--sweep ...]
#
# 1. copies this repository to ~/transformer on every worker (SETUP=1 also pip-installs it);
# 2. starts `python -m launch.local --multihost ARGS` on every worker at once. Each worker walks
#    the same run list in the same order; each run's `transformer.train` finds the slice's other
#    hosts itself (TPU_WORKER_HOSTNAMES) and `jax.distributed` joins them into one job.
# --workdir must be a directory every worker sees at the same path (Filestore/NFS, or a gcsfuse
# mount), so that all hosts agree on which runs are finished and share checkpoints. Re-running
# this script resumes the sweep. DRY_RUN=1 prints the gcloud commands instead of running them.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 TPU_NAME ZONE --config FILE[:ARGS] --workdir SHARED_DIR [launch.local flags]" >&2
  exit 2
fi
tpu=$1 zone=$2
shift 2
for arg in "$@"; do
  case $arg in --parallel*) echo "error: runs on a slice go one at a time; drop $arg" >&2; exit 2;; esac
done
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
remote_dir='~/transformer'
args=$(printf '%q ' "$@")

run() {
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

ssh_all() {
  run gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$1"
}

# The project's files only (git's list when there is one: no virtualenv, checkpoints or run
# outputs); every worker gets an identical copy.
archive=$(mktemp -t sweep-repo.XXXXXX.tar.gz)
trap 'rm -f "$archive"' EXIT
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z | tar --null -T - -czf "$archive")
else
  tar -C "$repo" --exclude=.git --exclude=.venv --exclude=runs --exclude='*.pyc' -czf "$archive" .
fi
run gcloud compute tpus tpu-vm scp "$archive" "$tpu:/tmp/sweep-repo.tar.gz" --zone "$zone" --worker=all
ssh_all "mkdir -p $remote_dir && tar -xzf /tmp/sweep-repo.tar.gz -C $remote_dir"
if [[ ${SETUP:-0} == 1 ]]; then
  ssh_all "cd $remote_dir && python3 -m pip install -q -e . 'jax[tpu]'"
fi
ssh_all "cd $remote_dir && python3 -m launch.local --multihost --parallel=1 $args"
