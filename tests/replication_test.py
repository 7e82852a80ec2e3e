"""experiments/probes/replication.py: the paired and Welch intervals against scipy's, and the
cells a shift or a mismatch of seeds must flag."""

import numpy as np
import pytest


def _agreement_results(by_scheme_seed_accs):
  """A results.json-shaped dict: {scheme: [seed accuracies at every attractor count]}."""
  return {"agreement": {s: {str(k): {"by_attractors": {str(a): {"accuracy": acc, "n": 500}
                                                      for a in range(5)}}
                            for k, acc in enumerate(accs)}
                        for s, accs in by_scheme_seed_accs.items()}}


def test_replication_matches_scipys_intervals_and_flags_a_shift():
  from scipy import stats as sp_stats

  from experiments.probes import replication
  a, b = [0.90, 0.95, 0.97], [0.93, 0.91, 0.99, 0.96]
  w = replication.welch(a, b)
  ref = sp_stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
  np.testing.assert_allclose(w["ci95"], [ref.low, ref.high], rtol=1e-10)
  np.testing.assert_allclose(w["diff"], np.mean(b) - np.mean(a))
  b3 = b[:3]
  p = replication.paired(a, b3)
  ref = sp_stats.ttest_rel(b3, a).confidence_interval(0.95)
  np.testing.assert_allclose(p["ci95"], [ref.low, ref.high], rtol=1e-10)
  ref90 = sp_stats.ttest_rel(b3, a).confidence_interval(0.90)
  np.testing.assert_allclose(p["ci90"], [ref90.low, ref90.high], rtol=1e-10)
  # The same models on both sides are equivalent; a shift far beyond the spread is different.
  same = _agreement_results({"alibi": a})
  rows = replication.compare(same, same)
  assert len(rows) == 5 and all(r["verdict"] == "equivalent" and r["diff"] == 0 for r in rows)
  shifted = _agreement_results({"alibi": [x - 0.3 for x in a]})
  assert all(r["verdict"] == "different" for r in replication.compare(same, shifted))
  assert "0 equivalent within ±0.05" in replication.table(replication.compare(same, shifted))
  assert "5 different" in replication.table(replication.compare(same, shifted))
  # A small shift on every seed is found by the pairing though the seeds spread far more.
  nudged = _agreement_results({"alibi": [x + 0.01 + 0.001 * i for i, x in enumerate(a)]})
  assert all(r["verdict"] == "different" for r in replication.compare(same, nudged))
  # Noise as wide as the margin: no difference found, and no sameness shown either.
  noisy = _agreement_results({"alibi": [a[0] + 0.04, a[1] - 0.05, a[2] + 0.02]})
  assert all(r["verdict"] == "inconclusive" for r in replication.compare(same, noisy))
  # With a margin wider than that noise's 90% interval, the same cells are equivalent.
  assert all(r["verdict"] == "equivalent" for r in replication.compare(same, noisy, 0.2))
  with pytest.raises(ValueError, match="--margin=0"):
    replication.compare(same, same, 0)
  with pytest.raises(ValueError, match="needs the same seeds"):
    replication.compare(same, _agreement_results({"alibi": [0.9]}))


def test_replication_refuses_models_of_different_corpora():
  from experiments.probes import replication
  a = [0.90, 0.95, 0.97]
  grammar = dict(_agreement_results({"alibi": a}), dataset="grammar_corpus")
  stdlib = dict(_agreement_results({"alibi": a}), dataset="python_stdlib")
  with pytest.raises(ValueError, match="same corpus"):
    replication.compare(grammar, stdlib)
  # Files written before the "dataset" key: the corpus comes from the recorded command.
  old = lambda arg: dict(_agreement_results({"alibi": a}), command=(
      f"python -m experiments.probes.run --config configs/probes.py{arg} --workdir w"))
  assert replication.dataset_of(old("")) == "grammar_corpus"
  assert replication.dataset_of(old(":dataset=python_stdlib")) == "python_stdlib"
  assert replication.dataset_of(old(":tiny=true,dataset=python_stdlib")) == "python_stdlib"
  assert replication.dataset_of(_agreement_results({"alibi": a})) is None
  with pytest.raises(ValueError, match="same corpus"):
    replication.compare(old(""), old(":dataset=python_stdlib"))
  assert len(replication.compare(grammar, old(""))) == 5
