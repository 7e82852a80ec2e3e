"""The documentation stays true to the code it describes."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_module_list_names_every_module_of_the_package():
  design = (ROOT / "docs" / "design.md").read_text()
  block = design.split("## Modules", 1)[1].split("```")[1]
  named = set(re.findall(r"[a-z_]+", block))
  modules = {p.stem for p in (ROOT / "transformer").rglob("*.py") if p.stem != "__init__"}
  packages = {p.parent.name for p in (ROOT / "transformer").rglob("__init__.py")}
  assert not modules - named, f"docs/design.md's module list lacks {sorted(modules - named)}"
  assert not packages - named, f"... and the packages {sorted(packages - named)}"


def test_the_readme_links_to_the_module_list():
  assert "docs/design.md#modules" in (ROOT / "README.md").read_text()
