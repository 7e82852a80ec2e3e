"""The package layout's rules: the library never imports the checkout's top-level folders, and
no library module defines absl flags at import (only the entry points do)."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRY_POINTS = {"train.py", "generate.py", "inspect.py", "convert.py"}


def _library_modules():
  for path in sorted((ROOT / "transformer").rglob("*.py")):
    yield path


def test_library_never_imports_configs_experiments_or_launch():
  pattern = re.compile(r"^\s*(from|import)\s+(configs|experiments|launch)\b", re.M)
  offenders = [str(p.relative_to(ROOT)) for p in _library_modules()
               if pattern.search(p.read_text())]
  assert not offenders, offenders


def test_importing_every_library_module_loads_no_top_level_folder_and_defines_no_flags():
  modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in _library_modules()
             if p.name not in ENTRY_POINTS or p.parent.name != "transformer"]
  script = (
      "import importlib, sys\n"
      "from absl import flags\n"
      f"for m in {modules!r}: importlib.import_module(m)\n"
      "print(sorted(m for m in flags.FLAGS.flags_by_module_dict() if 'transformer' in m))\n"
      "print(sorted(m for m in sys.modules if m.split('.')[0] in "
      "('configs', 'experiments', 'launch')))\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, check=True).stdout.splitlines()
  assert out == ["[]", "[]"], out


def test_no_library_module_is_much_over_400_lines():
  # "A few hundred lines at most": ~400, none past 450 (the HF families' name maps are 441).
  long = {str(p.relative_to(ROOT)): n for p in _library_modules()
          if (n := len(p.read_text().splitlines())) > 450}
  assert not long, long
