"""The values of a sweep declaration: "key=values;key=values" axes, numbers, random-search
distributions, and the run names made from a run's values (launch/sweep.py and
launch/scaling_grid.py share them)."""

import hashlib
import math
import re

import numpy as np

from launch.sweep_dir import format_cell


def scalar(text: str):
  text = text.strip()
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def split(text: str) -> list[str]:
  """`text` split at its commas outside parentheses, so a tuple value "(1,1,1)" or a
  distribution "loguniform(1e-4,1e-2)" stays one value."""
  parts, depth, start = [], 0, 0
  for i, c in enumerate(text):
    depth += {"(": 1, ")": -1}.get(c, 0)
    if c == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  return parts + [text[start:]]


def numbers(text: str, what: str) -> list[float]:
  values = [scalar(v) for v in text.split(",") if v.strip()]
  if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
    raise ValueError(f"sweep.{what} must be positive numbers like '1e5,3e5', got {text!r}")
  return [float(v) for v in values]


def axes(text: str) -> list[tuple[str, str]]:
  axes = []
  for part in filter(str.strip, text.split(";")):
    key, sep, values = part.partition("=")
    if not sep or not key.strip() or not values.strip():
      raise ValueError(f"sweep axis {part!r} is not KEY=VALUES (e.g. opt.lr=1e-4,1e-3)")
    if key.strip() in (k for k, _ in axes):  # the later axis would silently replace it
      raise ValueError(f"sweep key {key.strip()} is on two axes; give its values on one "
                       f"(e.g. {key.strip()}=1e-3,2e-3)")
    axes.append((key.strip(), values.strip()))
  if not axes:
    raise ValueError("sweep.axes is empty; e.g. 'opt.lr=1e-4,1e-3;model.d_model=128,256'")
  return axes


def _round(x: float) -> float:
  return float(f"{x:.3g}")  # draws with 3 significant digits keep names and configs readable


# Random-search distributions: name -> draw(rng, args) of one value.
DISTRIBUTIONS = {
    "choice": lambda rng, args: args[rng.integers(len(args))],
    "uniform": lambda rng, args: _round(rng.uniform(args[0], args[1])),
    "loguniform": lambda rng, args: _round(math.exp(rng.uniform(*np.log(args[:2])))),
    "int": lambda rng, args: int(rng.integers(int(args[0]), int(args[1]) + 1)),  # inclusive
}


def is_distribution(text: str) -> bool:
  """Whether a value is written NAME(args), a random-search distribution."""
  match = re.fullmatch(r"(\w+)\((.*)\)", text.strip())
  return bool(match) and match.group(1) in DISTRIBUTIONS


def distribution(key: str, text: str):
  text = text.strip()
  match = re.fullmatch(r"(\w+)\((.*)\)", text)
  if not is_distribution(text):
    raise ValueError(f"random axis {key}={text!r}: want NAME(args) with NAME one of "
                     f"{sorted(DISTRIBUTIONS)}")
  name, args = match.group(1), [scalar(a) for a in split(match.group(2))]
  if name != "choice" and (len(args) != 2 or not all(isinstance(a, (int, float)) for a in args)):
    raise ValueError(f"random axis {key}={text!r}: {name} takes two numbers (low, high)")
  if name != "choice" and not args[0] <= args[1]:
    raise ValueError(f"random axis {key}={text!r}: low {args[0]} is above high {args[1]}")
  if name == "loguniform" and args[0] <= 0:
    raise ValueError(f"random axis {key}={text!r}: loguniform needs 0 < low <= high")
  if name == "choice" and not match.group(2).strip():
    raise ValueError(f"random axis {key}={text!r}: choice takes at least one value")
  return lambda rng: DISTRIBUTIONS[name](rng, args)


# --- run names ----------------------------------------------------------------------------------

def short(x: float) -> str:
  return f"{x:.3g}".replace("e+0", "e").replace("e+", "e")  # 1e+13 -> 1e13


def _cell(value) -> str:
  """A value in a run name; a tuple (mesh.shape) as 1x2x1."""
  if isinstance(value, (tuple, list)):
    return "x".join(_cell(v) for v in value)
  return format_cell(value)


def run_name(values: dict) -> str:
  """Deterministic directory name from the values that define a run: 'lr=0.001,d_model=256'.

  Keys are shortened to their last component unless two would collide; unsafe characters
  become '_'; names past 120 characters are cut and end in a hash of the full name.
  """
  leaves = [k.rsplit(".", 1)[-1] for k in values]
  keys = [leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(values, leaves)]
  name = ",".join(f"{k}={_cell(v)}" for k, v in zip(keys, values.values()))
  name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)
  if len(name) > 120:
    name = name[:111] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
  return name
