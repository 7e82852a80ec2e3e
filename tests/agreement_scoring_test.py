"""Agreement scoring compares complete words: a scorer that knows the answer gets every item
right, including those whose two verb forms are prefixes of each other (" sleep" /
" sleeps"), which the pre-fix scoring (no boundary after the verb) got wrong."""

import numpy as np
import pytest

from experiments.probes import run as probes
from experiments.probes import stats
from transformer import data
from transformer.data import tokenizers


class OracleScorer:
  """Assigns the grammar's next-word probabilities after an agreement prefix: the agreeing
  verb with probability p, the other form with 1 - p, each followed by " " or "." with
  probability 1/2 (what the grammar produces after a verb), spelled out character by
  character; text past the boundary is certain. A continuation's probability is the mass of
  the completions it is a prefix of (or that are a prefix of it)."""

  def __init__(self, items, p=0.9):
    # Keyed by prefix and verb form: several items share a prefix ("The key").
    self.answers = {(it.prefix, w): it for it in items for w in (it.correct, it.wrong)}
    self.p = p

  def continuation_scores(self, tokenizer, prefixes, continuations, **_):
    logps = []
    for prefix, cont in zip(prefixes, continuations):
      it = self.answers[prefix, cont.strip(" .")]
      mass = {" " + it.correct + b: self.p / 2 for b in probes.WORD_BOUNDARIES}
      for b in probes.WORD_BOUNDARIES:
        mass[" " + it.wrong + b] = mass.get(" " + it.wrong + b, 0) + (1 - self.p) / 2
      total = sum(m for w, m in mass.items() if w.startswith(cont) or cont.startswith(w))
      logps.append(np.log(total) if total > 0 else -np.inf)
    return np.asarray(logps), np.zeros(len(logps), bool)


@pytest.fixture(scope="module")
def prefix_items():
  items = [it for k in range(3) for it in data.agreement_probes(300, k, seed=1)
           if it.correct.startswith(it.wrong) or it.wrong.startswith(it.correct)]
  assert {probes.head_number(it) for it in items} == {"sg", "pl"}
  assert len(items) > 50
  return items


def test_a_scorer_that_knows_the_answer_scores_one_on_prefix_forms(prefix_items):
  oracle = OracleScorer(prefix_items)
  right = probes.agreement_correct(oracle, tokenizers.BytesTokenizer(), prefix_items)
  assert right.all()


def test_the_old_scoring_fails_the_same_oracle(prefix_items):
  oracle = OracleScorer(prefix_items)
  right = probes.agreement_correct(oracle, tokenizers.BytesTokenizer(), prefix_items,
                                   boundaries=("",))
  singular = np.array([probes.head_number(it) == "sg" for it in prefix_items])
  # " sleep" is a prefix of " sleeps": with nothing after it, it is at least as probable as
  # " sleeps" under any model, so every singular item is lost and every plural one won.
  assert not right[singular].any() and right[~singular].all()


def test_wilson_interval():
  lo, hi = probes.wilson(95, 100)
  assert lo == pytest.approx(0.8882, abs=1e-3) and hi == pytest.approx(0.9785, abs=1e-3)
  assert probes.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)


def test_wilson_interval_holds_the_proportion_and_stays_in_0_1():
  # All-wrong and all-right cells are common (ALiBi near the last pair, failed schemes beyond
  # L): rounding once put their bound past the proportion, a negative plot error bar.
  for n in range(1, 600):
    for k in range(n + 1):
      lo, hi = probes.wilson(k, n)
      assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)
  assert probes.wilson(0, 500)[0] == 0.0 and probes.wilson(500, 500)[1] == 1.0


def test_verb_kinds_cover_every_probe_item():
  kinds = {probes.verb_kind(it) for k in range(5) for it in data.agreement_probes(200, k)}
  assert {"copula", "has/have", "intransitive (prefix forms)",
          "transitive (prefix forms)"} <= kinds


def test_u_test_needs_each_end_above_the_middle_by_two_standard_errors():
  n = 500
  u = probes.u_test({0: (450, n), 1: (300, n), 2: (250, n), 3: (300, n), 4: (440, n)})
  assert u["u_shaped"] and u["middle_positions"] == [2]
  lo, hi = u["ends_minus_middle_ci95"]
  assert lo < u["ends_minus_middle"] < hi and lo > 0
  # Primacy only: the pooled ends beat the middle, but the last position does not.
  assert not probes.u_test({0: (450, n), 1: (300, n), 2: (250, n), 3: (250, n),
                            4: (255, n)})["u_shaped"]
  flat = probes.u_test({p: (500, n) for p in range(5)})
  assert flat["u_shaped"] is False
  # Standard errors of two independent proportions of unequal sizes, from the formula.
  u = probes.u_test({0: (90, 100), 1: (150, 300), 2: (240, 600), 3: (150, 300), 4: (60, 200)})
  se = lambda pa, na, pb, nb: np.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)
  assert u["middle_positions"] == [2] and u["middle"] == pytest.approx(0.4)
  assert u["first_se"] == pytest.approx(se(0.9, 100, 0.4, 600))
  assert u["last_se"] == pytest.approx(se(0.3, 200, 0.4, 600))
  assert u["ends_se"] == pytest.approx(se(150 / 300, 300, 0.4, 600))


def test_scheme_overrides_are_applied_and_bad_ones_refused():
  from configs import extrapolation as config_module
  from experiments.extrapolation import run as extrapolation
  config = config_module.get_config("tiny=true")
  config.experiment.overrides.rope = "opt.lr=3e-4;train.steps=7"
  cfg = extrapolation.scheme_config(config, "rope", seed=2)
  assert (cfg.opt.lr, cfg.train.steps, cfg.train.seed) == (3e-4, 7, 2)
  assert extrapolation.scheme_config(config, "sinusoidal").model.scale_embeddings
  config.experiment.overrides.rope = "opt.nonexistent=1"
  with pytest.raises(ValueError, match="experiment.overrides.rope"):
    extrapolation.scheme_config(config, "rope")
  config.experiment.overrides.rope = "opt.lr"
  with pytest.raises(ValueError, match="key=value"):
    extrapolation.scheme_config(config, "rope")


def test_newcombe_interval_matches_the_papers_worked_examples():
  # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10 (hybrid score).
  for (a, n_a, b, n_b), want in [((56, 70, 48, 80), (0.0524, 0.3339)),
                                 ((5, 56, 0, 29), (-0.0381, 0.1926)),
                                 ((0, 10, 0, 20), (-0.1611, 0.2775)),
                                 ((0, 10, 0, 10), (-0.2775, 0.2775))]:
    assert stats.newcombe(a, n_a, b, n_b) == pytest.approx(want, abs=1e-4), (a, n_a, b, n_b)


def test_u_test_interval_keeps_a_width_for_all_wrong_and_all_right_rows():
  # The Wald interval (+- 1.96 SE) read "+0.000 [+0.000, +0.000]" for a failed model's rows.
  for k in (0, 100):
    u = probes.u_test({p: (k, 100) for p in range(6)})
    lo, hi = u["ends_minus_middle_ci95"]
    assert -1 <= lo < 0 < hi <= 1 and u["u_shaped"] is False
  for counts in ({0: (3, 50), 1: (0, 50), 2: (0, 50), 3: (1, 50), 4: (50, 50)},
                 {0: (20, 40), 1: (25, 40), 2: (10, 40), 3: (30, 40), 4: (38, 40)}):
    u = probes.u_test(counts)
    lo, hi = u["ends_minus_middle_ci95"]
    assert -1 <= lo < u["ends_minus_middle"] < hi <= 1


def test_pooling_recomputes_each_seeds_u_test_from_its_items():
  """A row read from a cached evaluation carries the u_test of the code that cached it; the
  tables use the current one, from the row's items."""
  row = {"accuracy_by_position": {str(p): {"accuracy": acc, "n": 100}
                                  for p, acc in enumerate([0.9, 0.5, 0.4, 0.5, 0.9])},
         "context_tokens": 50, "mean_accuracy": 0.64,
         "u_test": {"u_shaped": False, "ends_minus_middle": 0.0, "first_minus_middle": 0.0,
                    "last_minus_middle": 0.0}}
  pooled = stats.pool_retrieval({0: {"8": row}, 1: {"8": row}})[8]
  assert pooled["u_shaped_seeds"] == 2
  assert pooled["ends_minus_middle"]["mean"] == pytest.approx(0.5)
