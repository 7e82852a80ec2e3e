"""TFDS builders for the built-in datasets; all generated locally, no downloads.

Each builder turns the data config into a tfds BuilderConfig whose *name*
encodes every knob that changes the data, so different settings live in
different directories under data_dir and built data is safely reused. Bump a
builder's VERSION when its generator changes, or old data would be reused.

Records are {'text'} for language-model corpora and {'inputs', 'targets'} for
seq2seq tasks (see `FIELDS`).
"""

import dataclasses
import functools
import hashlib
import os
import random
import sys
import sysconfig

import tensorflow_datasets as tfds

from transformer.data import algorithmic
from transformer.data import grammar
from transformer.data import kv_retrieval
# text_folder_files / text_folder_cuts are read through this module by sources.py and tests.
from transformer.data.text_folder import (_FILE_TEXT, TextFolder, split_of,  # noqa: F401
                                          text_folder_cuts, text_folder_files)

# Synthetic datasets: size name -> (train examples, examples per eval split).
SIZES = {"tiny": (1_000, 100), "small": (50_000, 1_000), "medium": (500_000, 5_000),
         "large": (2_000_000, 10_000)}

_TEXT = tfds.features.FeaturesDict({"text": tfds.features.Text()})
_SEQ2SEQ = tfds.features.FeaturesDict({"inputs": tfds.features.Text(),
                                       "targets": tfds.features.Text()})


def _size(data_config) -> tuple[int, int]:
  if data_config.size not in SIZES:
    raise ValueError(f"unknown data.size {data_config.size!r}; valid: {list(SIZES)}")
  return SIZES[data_config.size]


def doc_sentences(data_config) -> tuple[int, int]:
  """data.doc_sentences "lo,hi" -> (lo, hi): grammar_corpus sentences per document."""
  text = str(data_config.get("doc_sentences", "3,7"))
  try:
    lo, hi = (int(x) for x in text.split(","))
  except ValueError:
    lo = hi = 0
  if not 1 <= lo <= hi:
    raise ValueError(f"data.doc_sentences must be 'lo,hi' with 1 <= lo <= hi (e.g. '1,1'), "
                     f"got {text!r}")
  return lo, hi


def max_doc_tokens(data_config) -> int:
  """data.max_doc_tokens: grammar_corpus documents of more tokens (bytes + BOS + EOS) are
  redrawn; 0 (the default) keeps every document."""
  value = int(data_config.get("max_doc_tokens", 0) or 0)
  if value < 0:
    raise ValueError(f"data.max_doc_tokens must be >= 0 (0: off), got {value}")
  return value


def _rng(*parts) -> random.Random:
  # String seeds go through sha512 in `random`, so they are stable across runs and machines.
  return random.Random("/".join(map(str, parts)))


def _sized_splits(builder):
  """train with the config's num_train examples, validation and test with num_eval each."""
  c = builder.builder_config
  return {s: builder._generate_examples(s, n) for s, n in
          (("train", c.num_train), ("validation", c.num_eval), ("test", c.num_eval))}


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
  num_train: int = 0
  num_eval: int = 0
  task: str = ""
  min_length: int = 0
  max_length: int = 0
  eval_min_length: int = 0
  eval_max_length: int = 0
  num_pairs: int = 0
  min_sentences: int = grammar.DOC_SENTENCES[0]
  max_sentences: int = grammar.DOC_SENTENCES[1]
  max_doc_tokens: int = 0
  min_pairs: int = 0


class GrammarCorpus(tfds.core.GeneratorBasedBuilder):
  """Documents from `grammar.document`; configs are the SIZES names, plus
  "<size>-sentences<lo>-<hi>" for a data.doc_sentences other than the default 3,7 and a
  "-maxtokens<m>" suffix for data.max_doc_tokens=m (documents over m tokens redrawn)."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [SyntheticConfig(name=n, num_train=t, num_eval=e)
                     for n, (t, e) in SIZES.items()]

  @classmethod
  def config_from(cls, data_config):
    num_train, num_eval = _size(data_config)
    lo, hi = doc_sentences(data_config)
    cap = max_doc_tokens(data_config)
    if (lo, hi) == grammar.DOC_SENTENCES and not cap:
      return data_config.size  # the original directories and bytes
    name = data_config.size
    if (lo, hi) != grammar.DOC_SENTENCES:
      name += f"-sentences{lo}-{hi}"
    if cap:
      from transformer.data import grammar_lengths  # pylint: disable=g-import-not-at-top
      if grammar_lengths.fit_probability((lo, hi), cap) <= 0:
        raise ValueError(f"data.max_doc_tokens={cap}: no data.doc_sentences={lo},{hi} document "
                         f"is that short, so redrawing would never end; raise it")
      name += f"-maxtokens{cap}"
    return SyntheticConfig(name=name, num_train=num_train, num_eval=num_eval,
                           min_sentences=lo, max_sentences=hi, max_doc_tokens=cap)

  def _info(self):
    description = "English-like documents from a probabilistic grammar (see grammar.py)."
    c = self.builder_config
    if c.max_doc_tokens:
      from transformer.data import grammar_lengths  # pylint: disable=g-import-not-at-top
      z = grammar_lengths.fit_probability((c.min_sentences, c.max_sentences), c.max_doc_tokens)
      description += (f" {c.min_sentences}-{c.max_sentences} sentences per document, redrawn "
                      f"above {c.max_doc_tokens} tokens (bytes + BOS + EOS): a fraction "
                      f"Z = {z:.10f} of the generator's documents fit (exact).")
    return tfds.core.DatasetInfo(builder=self, features=_TEXT, description=description)

  def _split_generators(self, dl_manager):
    return _sized_splits(self)

  def _generate_examples(self, split, num):
    for i in range(num):
      c = self.builder_config
      yield i, {"text": grammar.document(_rng("grammar", split, i),
                                         (c.min_sentences, c.max_sentences), c.max_doc_tokens)}


_REDRAWS = 1000  # draws per held-out algorithmic example before the lengths are refused


class Algorithmic(tfds.core.GeneratorBasedBuilder):
  """copy / reverse / sort / addition; split 'test_long' holds longer instances. Validation
  and test hold no instance of the training split."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "Validation and test hold no instance of the training split."}

  @classmethod
  def config_from(cls, data_config):
    algorithmic.get_task(data_config.task)
    num_train, num_eval = _size(data_config)
    lo, hi = data_config.min_length, data_config.max_length
    long_lo = data_config.eval_min_length or hi + 1
    long_hi = data_config.eval_max_length or 2 * hi
    for a, b in ((lo, hi), (long_lo, long_hi)):
      if not 1 <= a <= b:
        raise ValueError(f"algorithmic lengths need 1 <= min <= max, got {a}..{b}")
    name = f"{data_config.task}-len{lo}-{hi}-long{long_lo}-{long_hi}-{data_config.size}"
    return SyntheticConfig(name=name, num_train=num_train, num_eval=num_eval,
                           task=data_config.task, min_length=lo, max_length=hi,
                           eval_min_length=long_lo, eval_max_length=long_hi)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=_SEQ2SEQ,
                                 description="Algorithmic seq2seq tasks (see algorithmic.py).")

  def _split_generators(self, dl_manager):
    c = self.builder_config
    short, long = (c.min_length, c.max_length), (c.eval_min_length, c.eval_max_length)
    return {"train": self._generate_examples("train", c.num_train, short),
            "validation": self._generate_examples("validation", c.num_eval, short),
            "test": self._generate_examples("test", c.num_eval, short),
            "test_long": self._generate_examples("test_long", c.num_eval, long)}

  def _generate_examples(self, split, num, lengths):
    # Validation and test hold no training instance: short lengths have few distinct inputs (26
    # of length 1), so independent draws repeated ~13% of the training split in validation.
    # An instance found in train is redrawn from the next seed; others keep their own.
    c, task = self.builder_config, self.builder_config.task
    train = set() if split in ("train", "test_long") else self._train_inputs
    for i in range(num):
      for attempt in range(_REDRAWS):
        rng = _rng(task, split, i, attempt) if attempt else _rng(task, split, i)
        inputs, targets = algorithmic.example(task, rng, *lengths)
        if inputs not in train:
          break
      else:
        raise ValueError(
            f"algorithmic {task} lengths {lengths[0]}..{lengths[1]} hold too few instances "
            f"outside the {c.num_train} training examples for a held-out {split} split; "
            f"widen data.min_length..data.max_length or use a smaller data.size")
      yield i, {"inputs": inputs, "targets": targets}

  @functools.cached_property
  def _train_inputs(self) -> set[str]:
    c = self.builder_config
    return {algorithmic.example(c.task, _rng(c.task, "train", i), c.min_length,
                                c.max_length)[0] for i in range(c.num_train)}


class KvRetrieval(tfds.core.GeneratorBasedBuilder):
  """Associative recall with `num_pairs` pairs and a uniformly placed query."""

  VERSION = tfds.core.Version("1.0.0")

  @classmethod
  def config_from(cls, data_config):
    num_train, num_eval = _size(data_config)
    if data_config.num_pairs < 1:
      raise ValueError(f"data.num_pairs must be >= 1, got {data_config.num_pairs}")
    min_pairs = data_config.get("min_pairs", 0)
    if min_pairs and not 1 <= min_pairs <= data_config.num_pairs:
      raise ValueError(f"data.min_pairs must be 0 (fixed) or in [1, data.num_pairs="
                       f"{data_config.num_pairs}], got {min_pairs}")
    # Fixed-size datasets keep their old names (and prepared files).
    sizes = f"{min_pairs}to{data_config.num_pairs}" if min_pairs else str(data_config.num_pairs)
    return SyntheticConfig(name=f"pairs{sizes}-{data_config.size}", num_train=num_train,
                           num_eval=num_eval, num_pairs=data_config.num_pairs,
                           min_pairs=min_pairs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=_SEQ2SEQ,
                                 description="Key-value retrieval (see kv_retrieval.py).")

  def _split_generators(self, dl_manager):
    return _sized_splits(self)

  def _generate_examples(self, split, num):
    for i in range(num):
      c = self.builder_config
      inputs, targets = kv_retrieval.item(_rng("kv", split, i), c.num_pairs,
                                          min_pairs=c.min_pairs)
      yield i, {"inputs": inputs, "targets": targets}


def longest_seq2seq_chars(data_config, split: str) -> int | None:
  """The most characters an inputs or targets text of a built-in seq2seq dataset's `split`
  can have (ASCII, so bytes too); None for other datasets."""
  if data_config.name == "algorithmic":
    c = Algorithmic.config_from(data_config)
    return algorithmic.max_chars(c.task, c.eval_max_length if split == "test_long"
                                 else c.max_length)
  if data_config.name == "kv_retrieval":
    return kv_retrieval.max_chars(data_config.num_pairs)
  return None


# Directory names never holding library source: tests, installed packages, build config.
_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_GENERATED_MARKERS = ("autogenerated", "auto-generated", "generated from", "generated by",
                      "do not edit")


def _is_generated(relative_path: str, head: bytes) -> bool:
  # Build-time and table-generated files (codec tables, pydoc topics, sysconfig data)
  # are not code anyone wrote; their marker sits in the first lines.
  if os.path.basename(relative_path).startswith("_sysconfigdata"):
    return True
  first_lines = b"\n".join(head.splitlines()[:3]).decode("utf-8", "replace").lower()
  return any(m in first_lines for m in _GENERATED_MARKERS)


@functools.cache
def stdlib_files() -> dict[str, bytes]:
  """relative path -> source of this interpreter's pure-Python standard library."""
  root = sysconfig.get_paths()["stdlib"]
  files = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames
                         if d not in _STDLIB_SKIP_DIRS and not d.startswith("config-"))
    for name in sorted(filenames):
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      relative = os.path.relpath(path, root).replace(os.sep, "/")
      with open(path, "rb") as f:
        data = f.read()
      if _is_generated(relative, data[:2048]):
        continue
      try:
        data.decode("utf-8")
      except UnicodeDecodeError:
        continue
      files[relative] = data
  return files


def _content_sha256(files: dict[str, bytes]) -> str:
  h = hashlib.sha256()
  for relative in sorted(files):
    h.update(relative.encode() + b"\0" + hashlib.sha256(files[relative]).digest())
  return h.hexdigest()


class PythonStdlib(tfds.core.GeneratorBasedBuilder):
  """One record per stdlib .py file; the config name pins the Python version and content."""

  VERSION = tfds.core.Version("1.0.0")

  @classmethod
  def config_from(cls, data_config):
    del data_config
    v = sys.version_info
    digest = _content_sha256(stdlib_files())[:12]
    return tfds.core.BuilderConfig(
        name=f"{sys.implementation.name}{v.major}.{v.minor}.{v.micro}-{digest}")

  def _info(self):
    files = stdlib_files()
    sha = _content_sha256(files)
    return tfds.core.DatasetInfo(
        builder=self, features=_FILE_TEXT,
        description=(f"Standard library of Python {sys.version.split()[0]} "
                     f"({len(files)} files, content sha256 {sha}); split by path hash."),
        metadata=tfds.core.MetadataDict(python_version=sys.version.split()[0],
                                        content_sha256=sha, num_files=len(files)))

  def _split_generators(self, dl_manager):
    return {s: self._generate_examples(s) for s in ("train", "validation", "test")}

  def _generate_examples(self, split):
    for relative, data in stdlib_files().items():
      if split_of(relative) == split:
        yield relative, {"text": data.decode("utf-8"), "path": relative}


BUILDERS = {"grammar_corpus": GrammarCorpus, "algorithmic": Algorithmic,
            "kv_retrieval": KvRetrieval, "python_stdlib": PythonStdlib, "text_folder": TextFolder}
# The splits each built-in dataset writes (_split_generators): what train.*_split may name.
SPLITS = {name: ("train", "validation", "test") for name in BUILDERS} | {
    "algorithmic": ("train", "validation", "test", "test_long")}
FIELDS = {"grammar_corpus": ("text",), "algorithmic": ("inputs", "targets"),
          "kv_retrieval": ("inputs", "targets"), "python_stdlib": ("text",),
          "text_folder": ("text",)}
