"""Seq2seq toy tasks with a length knob, for length-generalization studies.

Each task maps a random instance of a given length to (inputs, targets) text.
Letters are written without separators so that one symbol is one byte-level
token; addition writes both operands with `length` digits each.
"""

import random
import string


def _letters(rng, length):
  return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def _copy(rng, length):
  s = _letters(rng, length)
  return s, s


def _reverse(rng, length):
  s = _letters(rng, length)
  return s, s[::-1]


def _sort(rng, length):
  s = _letters(rng, length)
  return s, "".join(sorted(s))


def _addition(rng, length):
  # Operands have exactly `length` digits so "longer" means longer numbers, not just larger.
  low = 0 if length == 1 else 10 ** (length - 1)
  a, b = rng.randrange(low, 10**length), rng.randrange(low, 10**length)
  return f"{a}+{b}", str(a + b)


TASKS = {"copy": _copy, "reverse": _reverse, "sort": _sort, "addition": _addition}


def max_chars(task: str, length: int) -> int:
  """The longest inputs or targets text an instance of `length` has (addition: a+b)."""
  get_task(task)
  return 2 * length + 1 if task == "addition" else length


def get_task(name: str):
  if name not in TASKS:
    raise ValueError(f"unknown algorithmic task {name!r}; valid: {sorted(TASKS)}")
  return TASKS[name]


def example(task: str, rng: random.Random, min_length: int, max_length: int) -> tuple[str, str]:
  """One (inputs, targets) pair with length drawn uniformly from [min_length, max_length]."""
  if not 1 <= min_length <= max_length:
    raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
  return get_task(task)(rng, rng.randint(min_length, max_length))
