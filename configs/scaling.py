r"""Scaling study: the configs/lm.py decoder at many sizes and budgets, then the fits.

    python -m launch.local --config configs/scaling.py --workdir runs/scaling --parallel 2
    python -m experiments.scaling.fit --workdir runs/scaling

Arguments after the colon: design (see DESIGNS), dataset, tiny (a CI-sized 3-run sweep:
seconds per run). Change the design from the command line like any key, e.g.
    --config.sweep.sizes=1e5,3e5,1e6 --config.sweep.budgets=1e13,1e14
The default IsoFLOP design (8 sizes from 2e4 to 4e6 non-embedding parameters x 4 budgets: 29
runs of 23 to 25,000 steps; pairs under sweep.min_steps are dropped) costs 1.1e14 FLOPs in all:
about an hour on a 2-core CPU.
Shapes, parameter counts and the FLOPs convention: experiments/scaling/shapes.py.
"""

from launch import sweep


def _isoflop(s):
  # On grammar_corpus (seq_len 128) an exploratory sweep put the IsoFLOP minimum near 4e4
  # non-embedding parameters at 1e11 FLOPs and 3e4 at 1e12, so the sizes start below 5e4;
  # the large end (2e6, 4e6) shows the right-hand side of each IsoFLOP curve.
  s.update(kind="scaling", sizes="2e4,5e4,1e5,2e5,5e5,1e6,2e6,4e6",
           budgets="3e11,1e12,3e12,1e13")


def _tokens(s):
  # The same sizes at fixed token budgets: the approach-3 fit needs runs off the IsoFLOP lines.
  s.update(kind="scaling", sizes="5e4,2e5,8e5", tokens="5e5,2e6,8e6")


def _lr(s):
  s.update(kind="grid", axes="opt.lr=3e-4,1e-3,3e-3,1e-2;model.d_model=64,128")


def _random(s):
  s.update(kind="random", trials=8, seed=0,
           axes="opt.lr=loguniform(1e-4,1e-2);opt.warmup_steps=int(10,100);"
                "opt.weight_decay=choice(0.0,0.1)")


DESIGNS = {"isoflop": _isoflop, "tokens": _tokens, "lr": _lr, "random": _random}


def get_config(arg: str | None = None):
  from configs import lm
  from transformer import schema as common  # lazily: configs.lm pulls in the data pipeline

  args = common.parse_args(arg, design="isoflop", dataset="grammar_corpus", tiny=False)
  if args.design not in DESIGNS:
    raise ValueError(f"unknown design {args.design!r}; valid: {sorted(DESIGNS)}")
  config = lm.get_config(f"dataset={args.dataset}")
  config.sweep = sweep.default_config()
  DESIGNS[args.design](config.sweep)
  config.opt.warmup_steps = 50  # each scaling run caps this at a tenth of its steps
  if args.tiny:
    config.model.max_len = 32
    config.data.seq_len = 32
    config.train.batch_size = 4
    config.train.eval_batches = 1
    config.train.steps = 20  # grid / random runs; scaling runs get steps from their budget
    config.train.log_every = config.train.eval_every = config.train.checkpoint_every = 10
    if config.sweep.kind == "scaling":
      config.sweep.update(sizes="2e4,5e4,1e5", budgets="2e9", tokens="", min_steps=5)
  return config
