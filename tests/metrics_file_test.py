"""transformer/training/metrics_file.py: metrics.jsonl read back and cut back after a kill
(the resume tests that go through the trainer are in init_from_test.py)."""

import pytest

from transformer.training import metrics_file


def test_cut_back_drops_a_torn_last_line_even_with_no_row_past_the_step(tmp_path):
  """Appending after a torn line would glue the next row to it: the torn line goes even when
  every complete row is kept."""
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
  note = metrics_file.cut_back(path, 4, warn=None)
  assert note is not None and "dropped 0 past it and a torn last line" in note
  with open(path) as f:
    assert f.read() == '{"step": 1}\n{"step": 2}\n'


def test_only_the_last_line_may_be_torn_and_blank_lines_are_skipped(tmp_path):
  """A bad line followed by more text is damage, not a torn end, even when it is the last
  complete line; blank lines are no rows."""
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2, "lo\n{"step": 3')
  with pytest.raises(ValueError, match=f"{path}: line 2 is not valid JSON"):
    metrics_file.read(path, warn=None)
  with open(path, "w") as f:
    f.write('{"step": 1}\n\n{"step": 2}\n\n')
  assert metrics_file.parse(path, warn=None) == ([{"step": 1}, {"step": 2}], False)
