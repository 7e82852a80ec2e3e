"""Sweep declarations, the shape rule and counts (the launchers that run them:
launch_runs_test.py)."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from experiments.scaling import shapes
from helpers.launch_config import sweep_config as _config
from launch import sweep

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



# --- declarations --------------------------------------------------------------------------------

def test_grid_expands_every_combination_with_typed_values():
  runs = sweep.expand(_config(kind="grid", axes="opt.lr=1e-3,3e-3; model.d_model=64,128"))
  assert [r["name"] for r in runs] == ["lr=0.001,d_model=64", "lr=0.001,d_model=128",
                                       "lr=0.003,d_model=64", "lr=0.003,d_model=128"]
  assert runs[1]["overrides"] == {"opt.lr": 0.001, "model.d_model": 128}
  assert isinstance(runs[1]["overrides"]["model.d_model"], int)
  cmd = sweep.train_command("python", "transformer.train", "configs/lm.py:size=xs", "D/r",
                            runs[1]["overrides"], ("--config.train.seed=3",))
  assert cmd == ["python", "-m", "transformer.train", "--config=configs/lm.py:size=xs",
                 "--workdir=D/r", "--config.train.seed=3", "--config.opt.lr=0.001",
                 "--config.model.d_model=128"]


def test_run_names_are_deterministic_distinct_and_safe():
  assert sweep.run_name({"opt.lr": 3e-4, "model.d_model": 64}) == "lr=0.0003,d_model=64"
  # Two keys with one leaf keep their full paths rather than collide.
  assert sweep.run_name({"a.dropout": 0.1, "b.dropout": 0.2}) == "a.dropout=0.1,b.dropout=0.2"
  assert sweep.run_name({"data.name": "a/b c"}) == "name=a_b_c"
  long = sweep.run_name({f"k{i}": "x" * 20 for i in range(10)})
  assert len(long) == 120 and long == sweep.run_name({f"k{i}": "x" * 20 for i in range(10)})


def test_random_search_is_seeded_and_in_range():
  axes = "opt.lr=loguniform(1e-4,1e-2);model.d_model=choice(64,128);opt.warmup_steps=int(1,3)"
  runs = sweep.expand(_config(kind="random", axes=axes, trials=12, seed=7))
  assert runs == sweep.expand(_config(kind="random", axes=axes, trials=12, seed=7))
  assert runs != sweep.expand(_config(kind="random", axes=axes, trials=12, seed=8))
  assert len({r["name"] for r in runs}) == len(runs) <= 12
  for r in runs:
    o = r["overrides"]
    assert 1e-4 <= o["opt.lr"] <= 1e-2 and o["model.d_model"] in (64, 128)
    assert o["opt.warmup_steps"] in (1, 2, 3)


@pytest.mark.parametrize("settings, message", [
    (dict(kind="bayes"), "valid: .*grid.*random.*scaling"),
    (dict(kind="grid", axes=""), "sweep.axes is empty"),
    (dict(kind="grid", axes="opt.lr"), "not KEY=VALUES"),
    (dict(kind="grid", axes="opt.lrr=1,2"), "opt has no 'lrr'; valid: .*'lr'"),
    (dict(kind="random", axes="opt.lr=normal(0,1)"), "NAME one of .*loguniform"),
    (dict(kind="scaling", sizes="1e5"), "exactly one of sweep.budgets"),
    (dict(kind="scaling", sizes="1e5", budgets="1e12", tokens="1e6"), "exactly one"),
    (dict(kind="scaling", sizes="big", budgets="1e12"), "sizes must be positive numbers"),
    (dict(kind="scaling", sizes="1e5", budgets="1e3"), "design is empty"),
])
def test_bad_sweeps_fail_with_one_line(settings, message):
  with pytest.raises(ValueError, match=message):
    sweep.expand(_config(**settings))


def test_isoflop_design_hits_its_budgets():
  config = _config(kind="scaling", sizes="5e4,2e5,8e5", budgets="1e12,1e13")
  runs = sweep.expand(config)
  assert len(runs) == 6 and runs[0]["name"] == "N=5e4,C=1e12"
  for r in runs:
    o = r["overrides"]
    model = config.model.to_dict() | {k[6:]: v for k, v in o.items() if k.startswith("model.")}
    counts = shapes.param_counts(model)
    assert r["params_non_embedding"] == counts["non_embedding"]
    assert r["params_total"] == counts["non_embedding"] + 260 * model["d_model"]
    assert r["tokens"] == o["train.steps"] * 16 * 128
    assert r["flops"] == shapes.flops_per_token(model, 128) * r["tokens"]
    # Steps are whole, so the budget is met to within half a step.
    assert abs(r["flops"] - r["budget"]) <= 0.5 * r["flops"] / o["train.steps"] + 1
    assert o["train.eval_every"] <= max(1, o["train.steps"] // 10)
    assert o["opt.warmup_steps"] <= max(1, o["train.steps"] // 10)
  # Points that would train for fewer than min_steps are dropped.
  config.sweep.min_steps = 200
  assert all(r["overrides"]["train.steps"] >= 200 for r in sweep.expand(config))


def test_token_design_trains_on_its_tokens():
  runs = sweep.expand(_config(kind="scaling", sizes="1e5,1e6", tokens="2048000,4096000"))
  assert [r["tokens"] for r in runs] == [2048000, 4096000] * 2
  assert all(r["budget"] is None for r in runs)


@pytest.mark.parametrize("target", [1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 1e8, 1e9])
def test_shape_rule_lands_near_target(target):
  s = shapes.shape_for_size(target)
  n = shapes.param_counts(dict(s, vocab_size=0))["non_embedding"]
  # Widths step by head_dim (32), coarse for small models: the docstring's stated bounds.
  assert abs(math.log(n / target)) < math.log(1.4 if target < 1e5 else
                                              1.25 if target < 1e6 else 1.12)
  assert s["d_model"] == s["num_heads"] * s["head_dim"] and s["d_ff"] == 4 * s["d_model"]
  if target >= 1e6:  # tiny models have too few layers for the ratio to mean much
    assert 16 <= s["d_model"] / s["num_layers"] <= 64


_INSPECT = textwrap.dedent("""
    import json, sys
    from transformer import schema
    from transformer.analysis import model_stats
    from transformer.training import throughput
    out = []
    for model in json.loads(sys.argv[1]):
      cfg = schema.model_config(**model)
      counts = model_stats.count_params(cfg)
      terms = model_stats.flops_per_token(cfg, 256)
      out.append(dict(total=counts["total"], non_embedding=counts["non_embedding"],
                      inspect_flops=terms["total"],
                      train_flops=throughput.flops_per_token(cfg, 256, counts["non_embedding"]),
                      inspect_flops_total=terms["total_params_convention"],
                      train_flops_total=throughput.flops_per_token(
                          cfg, 256, counts["non_embedding"], counts["total"],
                          convention="total")))
    print(json.dumps(out))
""")


def test_counts_and_flops_match_the_model_code():
  models = []
  for target, ffn, kv, window in ((1e5, "gelu", 0, 0), (1e6, "swiglu", 1, 0),
                                  (3e6, "gelu", 0, 64)):
    models.append(dict(shapes.shape_for_size(target), ffn=ffn, num_kv_heads=kv, window=window))
  # The corrected rule's smallest shapes (head_dim 16 below d_model 64), untied head too.
  for target, tie in ((3.5e4, True), (1.39e5, False)):
    models.append(dict(shapes.shape_for_size(target, min_layers=2, min_heads=2,
                                             small_head_dim=16, count="total",
                                             vocab_size=260), tie_embeddings=tie))
  # A subprocess: transformer.inspect defines absl flags that clash with transformer.train's.
  proc = subprocess.run([sys.executable, "-c", _INSPECT, json.dumps(models)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  from transformer import schema
  for model, want in zip(models, json.loads(proc.stdout.splitlines()[-1])):
    cfg = schema.model_config(**model)
    got = shapes.param_counts(cfg)
    assert (got["total"], got["non_embedding"]) == (want["total"], want["non_embedding"])
    assert shapes.flops_per_token(cfg, 256) == want["inspect_flops"] == want["train_flops"]
    assert shapes.flops_per_token(cfg, 256, "total") == want["inspect_flops_total"] == \
        want["train_flops_total"]
    # The two conventions differ by exactly the embedding / output-projection parameters.
    assert want["inspect_flops_total"] - want["inspect_flops"] == \
        6 * (want["total"] - want["non_embedding"])


def test_scaling_config_builds_every_design():
  from configs import scaling  # pylint: disable=import-outside-toplevel
  configs = {d: scaling.get_config(f"design={d},tiny=true") for d in scaling.DESIGNS}
  assert [len(sweep.expand(configs[d])) for d in ("isoflop", "tokens", "lr", "random")] == \
      [3, 3, 8, 8]
  assert all(sweep.expand(c) for c in configs.values())
  with pytest.raises(ValueError, match="valid: .*isoflop"):
    scaling.get_config("design=fast")
