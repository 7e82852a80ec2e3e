"""Short timing runs behind the CPU budget in experiments/probes/README.md (writes
/tmp/wtp/timing.json; run with PYTHONPATH at the repository root)."""
import json, os, time, shutil
import numpy as np
from absl import logging
from configs import extrapolation as ex_cfg, probes as pr_cfg
from experiments.extrapolation import run as ex
from experiments.probes import run as pr
from transformer.training import loop, checkpoint
from transformer.inference.scoring import Scorer
from absl import flags; flags.FLAGS(["timing"]); loop.configure_host(); logging.set_verbosity(logging.ERROR)
out = {}
base = "/tmp/wtp/timing"; shutil.rmtree(base, ignore_errors=True)
def time_train(cfg, name, steps):
  cfg.train.steps = steps; cfg.train.log_every = steps; cfg.train.eval_every = steps
  cfg.train.checkpoint_every = steps; cfg.train.eval_batches = 1
  d = os.path.join(base, name)
  t = time.time(); loop.train_and_evaluate(cfg, d); t1 = time.time() - t
  cfg.train.steps = 2 * steps
  shutil.rmtree(d); t = time.time(); loop.train_and_evaluate(cfg, d); t2 = time.time() - t
  per_step = (t2 - t1) / steps  # the difference cancels compile, data building and eval
  out[name] = {"s_per_step": per_step}
  print(name, out[name], flush=True)
  return d
c = ex_cfg.get_config()
for scheme in ("rope", "alibi", "t5_bias"):
  d = time_train(ex.scheme_config(c, scheme, 0), "lm_" + scheme, 20)
# evaluation forward: tokens per second at each length, batch 8
_, mc, params, tok = checkpoint.load_for_inference(d)
sc = Scorer(mc, params)
for L in (128, 512, 2048):
  x = np.ones((8, L), np.int32); sc.token_losses(x, targets_BL=x)
  t = time.time(); [sc.token_losses(x, targets_BL=x) for _ in range(3)]
  out[f"eval_fwd_s_per_token_{L}"] = (time.time() - t) / (3 * 8 * L)
  print(L, out[f"eval_fwd_s_per_token_{L}"], flush=True)
p = pr_cfg.get_config()
kc = pr.kv_training_config(p)
d = time_train(ex.scheme_config(kc, "rope", 0), "kv_rope", 10)
_, mc, params, tok = checkpoint.load_for_inference(d)
sc = Scorer(mc, params)
from transformer import data
items = data.kv_items(32, 5, 64, seed=0)
sc.continuation_scores(tok, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
t = time.time()
sc.continuation_scores(tok, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
out["kv_eval_s_per_item_32pairs"] = (time.time() - t) / 64
items = data.kv_items(64, 5, 32, seed=0)
sc.continuation_scores(tok, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
t = time.time()
sc.continuation_scores(tok, [q + data.PROMPT_SEPARATOR for q, _ in items], [a for _, a in items])
out["kv_eval_s_per_item_64pairs"] = (time.time() - t) / 32
print(json.dumps(out, indent=1))
json.dump(out, open("/tmp/wtp/timing.json", "w"), indent=1)
