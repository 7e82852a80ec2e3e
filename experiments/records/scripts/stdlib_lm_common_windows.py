"""Score python_stdlib's ALiBi language models (seeds 1 and 2; seed 0's checkpoint was lost) on
the eval windows each train seed draws, to show that their final eval losses (2.100, 2.097, 1.838)
differ by the windows, not the models: the frozen loop (2e088a6) drew the eval windows with
train.seed. Main's loop draws them with train.eval_seed.

  cd /work/frozen-2e088a6 && PYTHONPATH=. /work/main/.venv/bin/python \
    /work/main/experiments/records/scripts/stdlib_lm_common_windows.py \
    /work/runs/extrapolation/python_stdlib/runs/alibi/seed{1,2} > common_windows.json
"""
import json
import sys

from transformer.training import checkpoint, loop, sharding

out = {}
for workdir in sys.argv[1:]:
  config, _, params, tokenizer = checkpoint.load_for_inference(workdir)
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size)
  built = loop.build(config, mesh)  # the eval step does not depend on the seed
  out[workdir] = {}
  for seed in (0, 1, 2):
    c = config.copy_and_resolve_references()
    c.train.seed = seed
    with sharding.activate(mesh):
      out[workdir][f"windows_of_seed{seed}"] = loop.evaluate(built.eval_step, params, c,
                                                              tokenizer, mesh)
print(json.dumps(out, indent=1))
