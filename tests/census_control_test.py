"""The head census's distance control (experiments/probes/census_control.py): nouns compared at
equal distance from the verb, on synthetic weights with a known answer, on a model's verb rows,
and end to end from the command line."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.probes import census_control, heads
from transformer import data
from transformer.data import tokenizers
from transformer.model import models
from transformer.schema import model_config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _nouns(weight_of, num_items=300, seed=0, heads_shape=(2, 3)):
  """noun_weights over agreement items (1-3 attractors, as the census draws them) whose
  weights weight_of(slot, role) gives, the same for every layer and head but scaled per head
  (so the strongest head is known)."""
  scale = np.arange(1, 1 + np.prod(heads_shape)).reshape(heads_shape) / np.prod(heads_shape)

  class Row:
    weights, verb_first = np.zeros(heads_shape + (1, 1)), 0  # BOS: weight 0

    def __init__(self, item):
      self.roles = heads.noun_roles(item)

    def mass(self, word):
      if word == 0:  # "The"
        return 0 * scale
      j = [w for w, _, _ in self.roles].index(word)
      return weight_of(len(self.roles) - j, self.roles[j][1]) * scale

  rows = [Row(item) for k in (1, 2, 3) for item in data.agreement_probes(num_items, k, seed)]
  return census_control.noun_weights(rows)


def test_slots_count_back_from_the_verb():
  item = next(it for it in data.agreement_probes(50, 2, seed=0)
              if len(heads.noun_roles(it)) == 3)
  nouns = census_control.noun_weights([None, _row_of(item)])
  assert nouns["skipped_too_long"] == 1 and nouns["items"] == 1
  assert nouns["slot"].tolist() == [3, 2, 1]  # the subject is the farthest noun
  assert nouns["role"][0] == "head"


def _row_of(item):
  class Row:
    roles = heads.noun_roles(item)
    weights, verb_first = np.zeros((1, 1, 1, 1)), 0

    def mass(self, word):
      return np.zeros((1, 1))
  return Row()


def test_a_recency_only_head_reads_zero_at_equal_distance_and_negative_unmatched():
  """Weight falls with distance and ignores roles: the census's unmatched subject-minus-
  nearest-attractor is negative, the same-slot measures are 0."""
  nouns = _nouns(lambda slot, role: 0.5 ** slot)
  cells = census_control._cells(nouns)
  assert [s for s, *_ in cells["subject_minus_other_same_slot"]] == [2, 3, 4]
  out = census_control.contrasts(nouns, cells)
  for v in out.values():
    np.testing.assert_allclose(v, 0.0, atol=1e-12)
  subject = nouns["weight"][nouns["role"] == "head"].mean(0)
  assert (subject < nouns["weight"][nouns["slot"] == 1].mean(0)).all()


def test_a_role_bonus_is_read_exactly_at_equal_distance():
  bonus = {"head": 0.1, "attractor": 0.03, "same_number": 0.0}
  nouns = _nouns(lambda slot, role: 0.5 ** slot + bonus[role])
  out = census_control.contrasts(nouns, census_control._cells(nouns))
  scale = nouns["weight"][0] / (0.5 ** nouns["slot"][0] + bonus[nouns["role"][0]])
  # Against the other nouns the subject's edge is 0.1 minus the others' mean bonus at each
  # slot, computed here by counting them.
  expected = []
  for s in (2, 3, 4):
    others = [r for r, sl in zip(nouns["role"], nouns["slot"]) if sl == s and r != "head"]
    expected.append(0.1 - np.mean([bonus[r] for r in others]))
  np.testing.assert_allclose(out["subject_minus_other_same_slot"], np.mean(expected) * scale,
                             rtol=1e-10)
  np.testing.assert_allclose(out["attractor_minus_same_number_same_slot"], 0.03 * scale,
                             rtol=1e-10)


def test_counting_each_item_once_is_the_point_estimate_and_resamples_weigh_items():
  rng = np.random.default_rng(1)
  nouns = _nouns(lambda slot, role: rng.uniform())
  cells = census_control._cells(nouns)
  point = census_control.contrasts(nouns, cells)
  ones = census_control.contrasts(nouns, cells, np.ones(nouns["items"]))
  for name in point:
    np.testing.assert_array_equal(point[name], ones[name])
  # Counting an item twice is the same as listing it twice.
  twice = np.ones(nouns["items"])
  twice[0] = 2
  doubled = {k: np.concatenate([v, v[nouns["item"] == 0]]) for k, v in nouns.items()
             if k in ("item", "slot", "role", "weight")}
  doubled_nouns = dict(nouns, **doubled)
  a = census_control.contrasts(nouns, cells, twice)
  b = census_control.contrasts(doubled_nouns, census_control._cells(doubled_nouns))
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-12)


def test_too_few_nouns_in_every_slot_is_a_clear_error():
  nouns = _nouns(lambda slot, role: 1.0, num_items=5)
  with pytest.raises(ValueError, match="in the 15 items read; more --items may fill one"):
    census_control._cells(nouns)
  # Items the model's positions cannot hold were left out: more items do not bring them back.
  with pytest.raises(ValueError, match="7 of the 22 items are longer than the model's max_len"):
    census_control._cells(dict(nouns, skipped_too_long=7))


def _tiny_model():
  cfg = model_config(vocab_size=260, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                     attention="dense")
  model = models.make_model(cfg)
  return model, model.init(jax.random.key(0), *models.dummy_inputs(cfg))["params"]


@pytest.mark.slow
def test_batched_rows_are_the_rows_one_item_at_a_time():
  """Right-padding a batch to its longest item leaves each item's causal weights as they are,
  and an item too long for max_len is None either way."""
  model, params = _tiny_model()
  tok = tokenizers.BytesTokenizer()
  one = list(heads.verb_rows(model, params, tok, 3, 0, max_len=64))
  batched = list(heads.verb_rows(model, params, tok, 3, 0, max_len=64, batch=4))
  assert [r is None for r in one] == [r is None for r in batched] and None in one
  for a, b in zip(one, batched):
    if a is not None:
      assert (a.verb_first, a.spans, a.roles) == (b.verb_first, b.spans, b.roles)
      np.testing.assert_allclose(a.weights, b.weights, atol=1e-6)


@pytest.mark.slow
def test_a_model_gets_per_head_scores_and_intervals_around_them():
  model, params = _tiny_model()
  tok = tokenizers.BytesTokenizer()
  out = census_control.same_slot(model, params, tok, 40, 0, resamples=50)
  # The unmatched measure of the strongest head is the census's own, computed there
  # item by item without padding.
  census = heads.census(model, params, tok, 40, 0)["subject_minus_attractor"]
  assert out["items"] == 120
  for name in census_control.MEASURES:
    r = out[name]
    assert np.asarray(r["scores"]).shape == (2, 2)
    s = r["strongest"]
    assert s["score"] == pytest.approx(np.max(r["scores"]), abs=1e-4)
    assert r["strongest"]["max_over_heads_95"][1] >= s["score"] - 1e-3
    lo, hi = s["this_head_95"]
    assert lo <= s["score"] <= hi
    assert 0 <= s["first_word"] <= 1 and 0 <= s["bos"] <= 1
    assert s["unmatched"] == pytest.approx(census[s["layer"], s["head"]], abs=1e-5)
    # Each slot's two sides, with their noun counts, reproduce the head's score.
    diffs = [a[0] - b[0] for a, b in (v.values() for v in r["by_slot"].values())]
    assert np.mean(diffs) == pytest.approx(s["score"], abs=1e-4)


@pytest.mark.slow
def test_command_line_tabulates_caches_and_refuses_a_wrong_directory(tmp_path):
  lm = tmp_path / "lm"
  env = dict(os.environ, TFDS_DATA_DIR=str(tmp_path / "tfds"))
  run = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                                     capture_output=True, text=True)
  proc = run("experiments.extrapolation.run", "--config",
             "configs/extrapolation.py:tiny=true,steps=4", "--workdir", str(lm),
             "--config.experiment.schemes=rope")
  assert proc.returncode == 0, proc.stderr[-3000:]
  args = ("experiments.probes.census_control", "--lm_workdir", str(lm), "--items=100",
          "--resamples=20")
  proc = run(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  table = (lm / "census_control.md").read_text()
  assert "| rope | subject_minus_other_same_slot | 0: " in table and "(one seed)" in table
  saved = json.loads((lm / "census_control.json").read_text())
  counted = saved["results"]["rope"]["0"]
  assert counted["items"] > 0 and counted["items"] + counted["skipped_too_long"] == 300
  # A second reading comes from the run's cache: no checkpoint is needed.
  os.rename(lm / "runs/rope/seed0/checkpoints", tmp_path / "moved")
  proc = run(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (lm / "census_control.md").read_text() == table
  proc = run(*args[:2], str(tmp_path))
  assert proc.returncode != 0 and "no finished run" in proc.stderr.splitlines()[-1]
