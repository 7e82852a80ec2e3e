r"""Scaling study: the configs/lm.py decoder at many sizes and budgets, then the fits.

    python -m launch.local --config configs/scaling.py --workdir runs/scaling --parallel 2
    python -m experiments.scaling.fit --workdir runs/scaling

Arguments after the colon: design (see DESIGNS), dataset, tiny (a CI-sized sweep: seconds per
run), doc_sentences (sets data.doc_sentences, "lo,hi"). The corrected designs on grammar_corpus
train on one-sentence documents that fit a row (data.doc_sentences=1,1, data.max_doc_tokens=128,
data.size=medium), so the loss floor E* every summary.json records is exact.
Change the design from the command line like any key, e.g.
    --config.sweep.sizes=1e5,3e5,1e6 --config.sweep.budgets=1e13,1e14

The original designs (isoflop, tokens, lr, random) are kept as they were. The corrected study
of issue 18 (Porian et al. 2024's corrections; experiments/scaling/README.md says why and how
to run it, in order):
  lr_sweep         5 learning rates x 3 sizes at 20 tokens per parameter, corrected settings;
                   experiments.scaling.lr_law fits lr(N) from it and writes lr_law.json
  corrected        the main grid: 5 IsoFLOP budgets 3e11..3e13 (total-parameter FLOPs),
                   the sizes of a 10^0.2 ladder within +-0.5 decade of the predicted optimum,
                   batch per budget so every run has >= 500 steps, lr from lr_law.json,
                   warmup = N tokens (<= 10% of the run), AdamW beta2 0.99, eval on >= 100k
                   tokens, 3 seeds at the 3 sizes nearest each predicted optimum; a second
                   stage reaches 0.9 decade below it and seeds the sizes nearest the
                   measured minima (D/N ~ 100) too
  ablation         the same models and budgets, one seed, with the original settings: lr 3e-3,
                   warmup 50 steps (<= 10%), beta2 0.95, budgets in non-embedding FLOPs
  ablation_flops   ... with budgets in total-parameter FLOPs (Porian's first correction)
  ablation_warmup  ... and warmup = N tokens (the second); `corrected` adds the tuned lr and
                   beta2 0.99 (the third)
  extended         the main grid one decade higher, 5 budgets 1e12..1e14, so every minimum
                   can have two sizes on each side: a 10^0.15 ladder, the 6 sizes nearest a
                   prior D/N per budget (the corrected grid's measured minima), 3 seeds at the
                   3 nearest, data.size=large, the committed lr law; budget by budget
  ablation_extended  the extended grid's models and budgets, one seed, original settings
  extended_deep    the extended grid with at least 3 layers (the extended grid's 2-layer
                   shapes lay 0.006-0.031 nats above their neighbours; Kaplan et al. 2020,
                   fig. 6, saw only models with fewer than 2 layers deviate): the same
                   sizes, budgets, seeds and settings; where no 3-layer shape at d_ff = 4
                   d_model is within 10% of a size (3.5e4), d_ff = 3 or 2 d_model
  ablation_extended_deep  its models and budgets, one seed, original settings
  extended_deep_window  the deep grid with every ladder size inside each budget's +-0.5-decade
                   window (max_sizes 7, not 6): 3 more runs, among them 6.98e4 at 3e13, the
                   second size left of that budget's measured minimum (point 5); and 3 seeds
                   at the 3 sizes nearest each measured minimum (4 more runs at 3e13 and 1e14)
  stdlib           python_stdlib, corrected settings, budgets it can feed at <= 4 epochs
  gpu              budgets 1e17..1e19, sizes 5M..1B, seq_len 1024: for launch/slurm.py and
                   launch/tpu_vm.sh (not for a CPU)
Shapes, parameter counts and the FLOPs conventions: experiments/scaling/shapes.py.
"""

from launch import sweep

# The corrected size ladder: total parameters (tied embedding included), 10^0.2 apart from
# the smallest model the shape rule allows (d_model 32 = 2 heads of 16, 2 layers: 33k).
LADDER = ",".join(f"{3.5e4 * 10 ** (0.2 * k):.3g}" for k in range(11))  # 3.5e4 .. 3.5e6
BUDGETS = "3e11,1e12,3e12,1e13,3e13"
# Per budget: the largest power of two that gives the budget's largest model >= 500 steps of
# seq_len 128 (tests/scaling_design_test.py checks every run has >= 500).
BATCHES = "4,8,16,16,32"
LR_LAW = "runs/scaling_lr/lr_law.json"  # written by experiments.scaling.lr_law
STDLIB_TOKENS = 8.0e6  # python_stdlib's train split: ~9M bytes in all, byte tokens


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


def _shape_rule(s):
  # At least 2 layers and 2 heads, head_dim 16 below d_model 64; sizes count all parameters.
  s.update(kind="scaling", size_convention="total", min_layers=2, min_heads=2,
           small_head_dim=16, head_dim=32, min_steps=500, eval_tokens=100_000, eval_points=4)


def _corrected_settings(config):
  """Porian et al.'s corrections: total-parameter FLOPs, warmup = N tokens, beta2 0.99."""
  s = config.sweep
  s.update(flops_convention="total", warmup_tokens_per_param=1.0)
  config.opt.b2 = 0.99  # fixed, not tuned (Porian et al.: 0.99 at small batch)


def _old_settings(config, flops="non_embedding", warmup=False):
  s = config.sweep
  s.update(flops_convention=flops, warmup_tokens_per_param=1.0 if warmup else 0.0,
           lr_law="")
  config.opt.lr, config.opt.b2, config.opt.warmup_steps = 3e-3, 0.95, 50


def _lr_sweep(config):
  _shape_rule(config.sweep)
  _corrected_settings(config)
  # Three sizes, each at the batch the main grid gives the budget where it is near optimal.
  config.sweep.update(sizes="3.5e4,1.39e5,3.5e5", tokens_per_param=20.0, batch_by="size",
                      batch_sizes="4,16,16", lrs="1e-3,2e-3,4e-3,8e-3,1.6e-2")


def _corrected(config):
  _shape_rule(config.sweep)
  _corrected_settings(config)
  # Two stages. The first took the sizes within +-0.5 decade of a 20-tokens-per-parameter
  # prior, seeds at the 3 nearest it. Its minima lay at ~100 tokens per parameter, at or near
  # the smallest size of three budgets, so the second reaches 0.9 decade below the prior
  # (two sizes left of each measured minimum where the shape rule has them) and seeds the 3
  # sizes nearest D/N = 100 as well. Every first-stage run stays in the sweep unchanged.
  config.sweep.update(sizes=LADDER, budgets=BUDGETS, batch_sizes=BATCHES, window=0.5,
                      window_below=0.9, tokens_per_param_prior=20.0, seeds=3, seed_sizes=3,
                      seed_tokens_per_param=100.0, lr_law=LR_LAW)


# The extended grid: two decades one decade higher, so that every budget's minimum can have
# two sizes on each side above the shape rule's 33k floor. Its ladder is 10^0.15 apart (the
# issue allows 10^0.2 at most) so that 1e12's minimum, ~6.5e4, has two sizes below it.
LADDER_FINE = ",".join(f"{3.5e4 * 10 ** (0.15 * k):.3g}" for k in range(14))  # .. 3.5e6
BUDGETS_EXTENDED = "1e12,3e12,1e13,3e13,1e14"
# The prior D/N per budget: D/N = 39.3 (C / 1e12)^0.29, the power law through the corrected
# grid's five approach-2 minima (results/grammar_corpus/fit.json: 28 at 3e11 .. 113 at 3e13).
PRIORS_EXTENDED = ",".join(f"{39.3 * (float(c) / 1e12) ** 0.29:.3g}"
                           for c in BUDGETS_EXTENDED.split(","))
BATCHES_EXTENDED = "8,16,16,32,64"  # the corrected grid's at its budgets; every run >= 500 steps
# The committed law of the corrected grid's lr sweep (opt.lr ~ 0.0072 N^-0.007, flat).
LR_LAW_COMMITTED = "experiments/scaling/results/grammar_corpus/lr_sweep_lr_law.json"


def _extended(config):
  _shape_rule(config.sweep)
  _corrected_settings(config)
  # Six sizes per budget, the nearest the prior (within +-0.5 decade), seeds at the 3 nearest.
  config.sweep.update(sizes=LADDER_FINE, budgets=BUDGETS_EXTENDED,
                      batch_sizes=BATCHES_EXTENDED, window=0.5, max_sizes=6,
                      tokens_per_param_priors=PRIORS_EXTENDED, seeds=3, seed_sizes=3,
                      lr_law=LR_LAW_COMMITTED, run_order="budget")


def _extended_deep(config):
  _extended(config)
  # Changes three of the ladder's shapes: 3.5e4 (3 layers, d_ff 2 d_model), 6.98e4 (5 layers)
  # and 3.93e5 (3 layers of d_model 96); every other run is the extended grid's.
  config.sweep.update(min_layers=3, ffn_fallback="3,2")


def _extended_deep_window(config):
  _extended_deep(config)
  # The window holds 7 ladder sizes at 3e12, 1e13 and 3e13; the cap at 6 dropped 6.98e4 at
  # 3e13, which the deep grid's measured minimum there (1.39e5) needs as its second left size.
  config.sweep.update(max_sizes=7)
  # The best seed mean per budget over those 63 runs (results/grammar_corpus/
  # extended_deep_window_results.md); the prior put seeds at 2.78e5, not 9.86e4, at 3e13, and
  # at 5.55e5, not 1.97e5, at 1e14. Runs are kept, so a second stage only adds seeds.
  config.sweep.update(seed_minima="6.98e4,9.86e4,1.39e5,1.39e5,2.78e5")


def _ablation(config, flops="non_embedding", warmup=False, grid=None):
  (grid or _corrected)(config)
  config.sweep.update(seeds=1)  # the grid's models and budgets, one seed
  _old_settings(config, flops, warmup)


def _stdlib(config):
  _corrected(config)
  # Data-limited: budgets whose smallest model would see the corpus > 4 times are pruned.
  config.sweep.update(budgets="3e11,1e12,3e12,1e13", batch_sizes="4,8,16,16", seeds=1,
                      dataset_tokens=STDLIB_TOKENS, max_epochs=4.0)
  # Its files are long (70% of the bytes in files over ten 16 x 128 batches), so without
  # shuffling the pieces a file fills many batches in a row and the loss swings with the
  # file: the first stdlib grid's final evaluations moved by up to 0.3 nats within 200 steps.
  config.data.shuffle_window = 16384  # pieces of 128 bytes: ~2M bytes, a quarter of train


def _gpu(config):
  # Budgets 1e17..1e19, sizes 5M..1B (total), seq_len 1024, head_dim 64; batch in sequences
  # of 1024 tokens per budget. Meant for launch/slurm.py and launch/tpu_vm.sh.
  _shape_rule(config.sweep)
  _corrected_settings(config)
  config.data.seq_len = 1024
  config.model.max_len = 1024
  config.sweep.update(
      sizes=",".join(f"{5e6 * 10 ** (0.2 * k):.3g}" for k in range(12)) + ",1e9",
      budgets="1e17,3e17,1e18,3e18,1e19", batch_sizes="64,128,256,256,512", head_dim=64,
      aspect_ratio=64.0, window=0.5, seeds=1, eval_tokens=1_048_576, min_steps=500,
      lr_law=LR_LAW.replace("scaling_lr", "scaling_lr_gpu"))


DESIGNS = {"isoflop": _isoflop, "tokens": _tokens, "lr": _lr, "random": _random,
           "lr_sweep": _lr_sweep, "corrected": _corrected, "ablation": _ablation,
           "ablation_flops": lambda c: _ablation(c, "total"),
           "ablation_warmup": lambda c: _ablation(c, "total", warmup=True),
           "stdlib": _stdlib, "gpu": _gpu, "extended": _extended,
           "extended_deep": _extended_deep, "extended_deep_window": _extended_deep_window,
           "ablation_extended": lambda c: _ablation(c, grid=_extended),
           "ablation_extended_deep": lambda c: _ablation(c, grid=_extended_deep)}
_ORIGINAL = ("isoflop", "tokens", "lr", "random")


def _tiny(config, design):
  config.model.max_len = 32
  config.data.seq_len = 32
  if config.data.max_doc_tokens:  # whole documents in 32-token rows
    config.data.update(max_doc_tokens=32, size="tiny")
  config.train.batch_size = 4
  config.train.eval_batches = 1
  config.train.steps = 20  # grid / random runs; scaling runs get steps from their budget
  config.train.log_every = config.train.eval_every = config.train.checkpoint_every = 10
  s = config.sweep
  if design in _ORIGINAL:
    if s.kind == "scaling":
      s.update(sizes="2e4,5e4,1e5", budgets="2e9", tokens="", min_steps=5)
    return
  s.update(min_steps=5, eval_tokens=256, dataset_tokens=0.0)
  if design == "lr_sweep":
    s.update(sizes="3.5e4,5.55e4", batch_sizes="4,4", lrs="1e-3,4e-3", tokens_per_param=2.0)
    return
  # Two budgets of three sizes; one seed pair; a literal lr law (no lr sweep to read).
  s.update(sizes="3.5e4,5.55e4,8.79e4", budgets="2e9,4e9", batch_sizes="4,4", window=0.0,
           tokens_per_param_priors="", max_sizes=0, seed_minima="",
           seeds=2 if design == "corrected" else 1, seed_sizes=1,
           lr_law="" if design.startswith("ablation") else "0.1,-0.3")
  if design == "gpu":
    s.update(head_dim=32, aspect_ratio=32.0, eval_tokens=256)


def get_config(arg: str | None = None):
  from configs import lm
  from transformer import schema as common  # lazily: configs.lm pulls in the data pipeline

  args = common.parse_args(arg, design="isoflop", dataset="", tiny=False, doc_sentences="")
  if args.design not in DESIGNS:
    raise ValueError(f"unknown design {args.design!r}; valid: {sorted(DESIGNS)}")
  dataset = args.dataset or ("python_stdlib" if args.design == "stdlib" else "grammar_corpus")
  config = lm.get_config(f"dataset={dataset}")
  config.sweep = sweep.default_config()
  config.opt.warmup_steps = 50  # each scaling run caps this at a tenth of its steps
  design = DESIGNS[args.design]
  if args.design in _ORIGINAL:
    design(config.sweep)
  else:
    design(config)
  if dataset == "grammar_corpus" and args.design not in _ORIGINAL:
    # Rows hold whole documents, so the loss floor E* is exact (transformer/data/
    # grammar_floor.py): one-sentence documents, the 0.7% longer than a row redrawn (Z is
    # exact too). medium: 5e5 documents, ~2.3e7 tokens, so the largest budget's smallest
    # model reads its data ~1.3 times.
    config.data.update(doc_sentences="1,1", max_doc_tokens=config.data.seq_len, size="medium")
    if "extended" in args.design:  # large: 2e6 documents, so 1e14's smallest model reads
      config.data.size = "large"   # its data < 2 times
  if args.doc_sentences:
    config.data.doc_sentences = args.doc_sentences
  if args.tiny:
    _tiny(config, args.design)
  return config
