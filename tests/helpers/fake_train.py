"""A stand-in for `transformer.train` in the launcher tests (tests/launch_runs_test.py): it parses
the same flags, "checkpoints" to DIR/ckpt, appends each call to the sweep's calls.jsonl and
writes a summary.json whose loss is a known function of the swept lr and width.

Environment: FAKE_OVERLAP=n waits until n runs have started; FAKE_INTERRUPT stops a fresh run
halfway (exit 3); FAKE_SLOW_START sleeps before its "loop" and exits 128+SIGTERM on SIGTERM.
"""

import json
import math
import os
import signal
import sys
import time

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
workdir, cfg = args["workdir"], {k[7:]: v for k, v in args.items() if k.startswith("config.")}
os.makedirs(workdir, exist_ok=True)
ckpt = os.path.join(workdir, "ckpt")
resumed = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
start = time.time()
if os.environ.get("FAKE_SLOW_START"):  # a trainer stopped before its loop exits 128+signal
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  open(os.path.join(os.path.dirname(workdir), "starting"), "w").close()
  time.sleep(30)
# FAKE_OVERLAP=n: wait (up to 5 s) until n runs of the sweep have started, so runs that the
# launcher starts together overlap however slowly a loaded machine starts each process.
open(os.path.join(os.path.dirname(workdir), "started." + os.path.basename(workdir)), "w").close()
while (len([f for f in os.listdir(os.path.dirname(workdir)) if f.startswith("started.")])
       < int(os.environ.get("FAKE_OVERLAP", 0)) and time.time() - start < 5):
  time.sleep(0.05)
time.sleep(0.4)
call = dict(name=os.path.basename(workdir), start=start, end=time.time(), resumed=resumed,
            cpus=sorted(os.sched_getaffinity(0)), xla=os.environ.get("XLA_FLAGS", ""),
            argv=sys.argv[1:])
with open(os.path.join(os.path.dirname(workdir), "calls.jsonl"), "a") as f:
  f.write(json.dumps(call) + "\n")
steps = int(cfg.get("train.steps", 10))
if os.environ.get("FAKE_INTERRUPT") and not resumed:
  open(ckpt, "w").write(str(steps // 2))
  sys.exit(3)
lr, width = float(cfg.get("opt.lr", 1e-3)), int(cfg.get("model.d_model", 64))
loss = 2 + abs(math.log10(lr) + 2.5) + 64 / width  # best: lr ~3e-3, wide
summary = dict(final_eval_loss=loss, params_total=width * 1000, params_non_embedding=width * 900,
               tokens=steps * 100, flops=steps * 100 * 6 * width * 900,
               flops_per_token=6 * width * 900, wall_time_s=0.4, step=steps,
               config={"opt.lr": lr, "model.d_model": width, "train.seed": 0})
json.dump(summary, open(os.path.join(workdir, "summary.json"), "w"))
