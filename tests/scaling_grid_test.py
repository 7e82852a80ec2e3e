"""launch/scaling_grid.py: a relative sweep.lr_law path is found from outside the repository."""

import json
import os

import pytest

from launch import scaling_grid, sweep

scaling = pytest.importorskip("configs.scaling")
COMMITTED = scaling.LR_LAW_COMMITTED  # relative to the repository root


def _law(path):
  with open(path) as f:
    law = json.load(f)
  return law["coef"], law["exponent"], law["convention"]


def test_a_relative_lr_law_resolves_against_the_repo_outside_it(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert scaling_grid._lr_law(COMMITTED) == _law(os.path.join(scaling_grid._ROOT, COMMITTED))
  assert sweep.expand(scaling.get_config("design=extended"))  # the config that names it


def test_a_path_here_or_absolute_is_used_as_given(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  os.makedirs(os.path.dirname(COMMITTED))
  with open(COMMITTED, "w") as f:  # the cwd's own copy wins over the repository's
    json.dump(dict(coef=0.5, exponent=-0.1), f)
  assert scaling_grid._lr_law(COMMITTED) == (0.5, -0.1, None)
  assert scaling_grid._lr_law(str(tmp_path / COMMITTED)) == (0.5, -0.1, None)
  with pytest.raises(ValueError, match=r"/nowhere/law.json does not exist; run"):
    scaling_grid._lr_law("/nowhere/law.json")
  with pytest.raises(ValueError, match=r"nowhere/law.json does not exist here or under "):
    scaling_grid._lr_law("nowhere/law.json")
