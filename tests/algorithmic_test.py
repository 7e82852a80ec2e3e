"""transformer/data/algorithmic.py and its builder: examples right by construction, lengths
over their whole range, and data.validate's arithmetic for them."""

import random

import pytest

from helpers.tiny_run import tiny_data
from transformer import data
from transformer.data import algorithmic, builders, sources


def test_algorithmic_examples_are_right_and_span_their_lengths():
  """Each task's targets follow from its inputs; lengths are drawn from all of [min, max];
  addition's operands have exactly `length` digits (no leading zero) and its sum is right;
  no text is longer than max_chars."""
  rng = random.Random(0)
  for task in algorithmic.TASKS:
    lengths = set()
    for _ in range(300):
      inputs, targets = algorithmic.example(task, rng, 2, 4)
      if task == "addition":
        a, b = inputs.split("+")
        assert len(a) == len(b) and a[0] != "0" and b[0] != "0"
        assert int(targets) == int(a) + int(b)
        lengths.add(len(a))
      else:
        want = {"copy": inputs, "reverse": inputs[::-1], "sort": "".join(sorted(inputs))}[task]
        assert targets == want and inputs.isalpha()
        lengths.add(len(inputs))
      assert max(len(inputs), len(targets)) <= algorithmic.max_chars(task, 4)
    assert lengths == {2, 3, 4}, task
  assert algorithmic.max_chars("addition", 4) == len("9999+9999")
  assert {algorithmic.example("copy", rng, 3, 3)[0].__len__() for _ in range(5)} == {3}


def test_algorithmic_train_inputs_are_the_train_splits_inputs(data_dir):
  """The held-out splits are redrawn against Algorithmic._train_inputs, which must be exactly
  the inputs the train split holds."""
  config = tiny_data(data_dir, name="algorithmic", task="copy", max_length=5)
  builder = builders.Algorithmic(data_dir=data_dir,
                                 config=builders.Algorithmic.config_from(config))
  assert builder._train_inputs == {r["inputs"] for r in sources.load(config, "train")}  # pylint: disable=protected-access


@pytest.mark.parametrize("task,max_length,longest", [("copy", 8, 8), ("addition", 3, 7)])
def test_validate_counts_the_eos_a_seq2seq_example_needs(tmp_path, task, max_length, longest):
  """A built-in seq2seq split whose longest text (addition: 'a+b' of max_length digits each)
  fills data.seq_len is refused before anything is built: its EOS needs one more position.
  test_long's examples (up to 2 * max_length) are checked against their own length."""
  config = tiny_data(tmp_path, name="algorithmic", task=task, max_length=max_length,
                     seq_len=longest)
  with pytest.raises(ValueError, match=f"'train' .* has examples of {longest + 1} tokens but "
                                       f"data.seq_len={longest}"):
    data.validate(config, "seq2seq", splits=("train",))
  config.seq_len = longest + 1
  data.validate(config, "seq2seq", splits=("train", "validation"))
  long_longest = algorithmic.max_chars(task, 2 * max_length)
  with pytest.raises(ValueError, match=f"'test_long' .* {long_longest + 1} tokens"):
    data.validate(config, "seq2seq", splits=("train", "test_long"))
  assert list(tmp_path.iterdir()) == []  # checked from the config alone
