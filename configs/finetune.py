r"""Fine-tune a run or a converted Hugging Face checkpoint: its own config, train.init_from set.

    python -m transformer.convert --from_hf HF_DIR --to runs/hf
    python -m transformer.train --config configs/finetune.py:from=runs/hf --workdir runs/ft
    python -m transformer.train --config configs/finetune.py:from=runs/xs:400 --workdir runs/ft

The model, data and objective blocks are the source's (WORKDIR/config.json, as the train or
convert command wrote it), so the key-by-key model check passes and the tokenizer is carried
over; train.init_from=WORKDIR starts from its latest parameters (WORKDIR:STEP from that
step's) with a fresh optimizer. The schedule is a fine-tuning one (`steps`, `lr` below, 10%
warmup); anything else from the command line, e.g. --config.data.name=text_folder
--config.data.path=DIR.
"""

import os

from transformer import data, schema
from transformer.training import init_from


def get_config(arg: str | None = None):
  args = schema.parse_args(arg, **{"from": "", "steps": 200, "lr": 1e-4})
  source = args["from"]
  workdir, _ = init_from.parse(source)
  path = os.path.join(workdir, "config.json")
  if not workdir or not os.path.exists(path):
    raise ValueError(f"configs/finetune.py needs from=WORKDIR[:STEP], a run or converted "
                     f"directory holding config.json (got {source!r})")
  # One line for a Hugging Face directory (convert it first) or a damaged config.json.
  saved = init_from.read_run_config(workdir, f"configs/finetune.py:from={source}")
  kind = saved["model"]["kind"]
  config = schema.experiment_config(
      schema.model_config(kind=kind), data.default_config(),
      schema.objective_config(saved["objective"]["name"]))
  flat = schema.flatten(config.to_dict())
  for key, value in schema.flatten(saved).items():
    # Not the source's mesh, logging or schedule: those belong to where and how it trained.
    if key in flat and key.startswith(("model.", "data.", "objective.")):
      node = config
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = tuple(value) if isinstance(flat[key], tuple) else value
  for key in ("batch_size", "seed", "data_shards", "train_split", "eval_split"):
    config.train[key] = saved.get("train", {}).get(key, config.train[key])
  config.train.update(dict(steps=args.steps, init_from=source, log_every=10,
                           eval_every=max(args.steps // 4, 1),
                           checkpoint_every=max(args.steps // 4, 1)))
  config.opt.update(dict(lr=args.lr, warmup_steps=max(args.steps // 10, 1), schedule="cosine"))
  return config
