"""The text_folder dataset: one record per .txt file under data.path, split by a hash of its
path (90/5/5), or by text when that leaves a split without a file."""

import dataclasses
import hashlib
import os

import tensorflow_datasets as tfds

# Files keep their relative path so splits and provenance can be checked per record.
_FILE_TEXT = tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                         "path": tfds.features.Text()})


def split_of(relative_path: str) -> str:
  """90/5/5 train/validation/test split decided by the file's path alone."""
  bucket = int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % 100
  return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


_MAX_RECORD_BYTES = 1 << 20


def text_folder_files(path: str) -> list[str]:
  """Relative paths of the .txt files under `path` (subfolders included), sorted."""
  if not path:
    raise ValueError("text_folder needs data.path: set --config.data.path=DIR, a directory "
                     "of .txt files")
  if not os.path.isdir(path):
    raise ValueError(f"data.path={path!r} is not a directory; text_folder needs a directory "
                     f"of .txt files")
  found = sorted(os.path.relpath(os.path.join(d, f), path).replace(os.sep, "/")
                 for d, _, names in os.walk(path) for f in names if f.endswith(".txt"))
  if not found:
    raise ValueError(f"no .txt files under data.path={path!r}; text_folder reads files named "
                     f"*.txt (subfolders included)")
  return found


def _paragraph_chunks(text: str) -> list[str]:
  """Huge files become several records so no record holds gigabytes: each cut falls after the
  last blank line that fits, else the last newline or space (a one-line text8-style file),
  else at the limit. The records join back to the file exactly."""
  chunks, start = [], 0
  while len(text) - start > _MAX_RECORD_BYTES:
    end = start + _MAX_RECORD_BYTES
    for sep in ("\n\n", "\n", " "):
      cut = text.rfind(sep, start, end)
      if cut >= 0:
        end = cut + len(sep)
        break
    chunks.append(text[start:end])
    start = end
  return chunks + [text[start:]]


@dataclasses.dataclass(eq=False)
class FolderConfig(tfds.core.BuilderConfig):
  path: str = ""


SPLITS = ("train", "validation", "test")
_HELD_OUT_FRACTION = 0.05  # of a small folder's text, for validation and for test each


def _read_text(root: str, relative: str) -> str:
  with open(os.path.join(root, relative), encoding="utf-8", errors="replace") as f:
    return f.read()


# Text is counted a block at a time: a one-line file (text8) may hold 100M characters.
_BLOCK = 1 << 16


def _visible(text: str) -> int:
  """Non-whitespace characters in `text`."""
  return sum(len("".join(text[b:b + _BLOCK].split())) for b in range(0, len(text), _BLOCK))


def _offset_of_visible(text: str, n: int) -> int:
  """The index in `text` of its n-th (from 0) non-whitespace character."""
  for begin in range(0, len(text), _BLOCK):
    piece = text[begin:begin + _BLOCK]
    count = _visible(piece)
    if n < count:
      return begin + [i for i, c in enumerate(piece) if not c.isspace()][n]
    n -= count
  raise IndexError(n)


def text_folder_cuts(root: str) -> dict[str, tuple[int, int]] | None:
  """None when the path hash gives every split a file; else where the text split cuts.

  Few files leave validation or test empty under the 90/5/5 file split (a folder of 40 files
  does so about one time in four) and TFDS cannot write an empty split. Such a folder is
  split by text instead, like nanoGPT's shakespeare_char or text8: its files in path order,
  the last 5% of its non-whitespace characters (at least one) go to test, the 5% before those
  to validation, the rest to train, cut where the counts fall (mid-line, as those do).
  Folders whose file split fills every split keep it, so their prepared copies stay valid.

  Returns where each split starts as (file index, character offset).
  """
  files = text_folder_files(root)
  if {split_of(relative) for relative in files} == set(SPLITS):
    return None
  visible_F = [_visible(_read_text(root, relative)) for relative in files]
  total = sum(visible_F)
  if total < len(SPLITS):
    raise ValueError(f"data.path={root!r} has {total} non-whitespace character(s) in "
                     f"{len(files)} .txt file(s); train, validation and test need one each: "
                     f"point data.path at a folder with text")
  held_out = max(1, round(_HELD_OUT_FRACTION * total))
  first = {"validation": total - 2 * held_out, "test": total - held_out}
  cuts, before = {}, 0
  for f, (relative, visible) in enumerate(zip(files, visible_F)):
    wanted = {s: n - before for s, n in first.items() if before <= n < before + visible}
    if wanted:
      text = _read_text(root, relative)
      cuts.update({s: (f, _offset_of_visible(text, n)) for s, n in wanted.items()})
    before += visible
  return cuts


def _text_split_pieces(root: str, cuts: dict[str, tuple[int, int]], split: str):
  """(relative path, text) for each file's part of `split`."""
  bounds = {"train": ((0, 0), cuts["validation"]),
            "validation": (cuts["validation"], cuts["test"]),
            "test": (cuts["test"], (1 << 62, 0))}[split]
  (start_file, start), (stop_file, stop) = bounds
  for f, relative in enumerate(text_folder_files(root)):
    if not start_file <= f <= stop_file:
      continue
    text = _read_text(root, relative)
    piece = text[start if f == start_file else 0:stop if f == stop_file else len(text)]
    if piece.strip():
      yield relative, piece


class TextFolder(tfds.core.GeneratorBasedBuilder):
  """Local .txt files, one record per file (or file part), split as in text_folder_cuts: by
  path hash like python_stdlib, or by text when that would leave a split without a file."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "A file over 1M characters is cut into records that join back to "
                            "it exactly, also where it has no blank line."}

  @classmethod
  def config_from(cls, data_config):
    path = os.path.abspath(os.path.expanduser(data_config.path)) if data_config.path else ""
    h = hashlib.sha256(path.encode())
    for relative in text_folder_files(path):
      st = os.stat(os.path.join(path, relative))
      # Size and mtime rather than contents: cheap on big folders, still rebuilds on edits.
      h.update(f"\0{relative}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    slug = "".join(c if c.isalnum() else "_" for c in os.path.basename(path))[:40] or "root"
    return FolderConfig(name=f"{slug}-{h.hexdigest()[:12]}", path=path)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=_FILE_TEXT,
                                 description=f"Text files under {self.builder_config.path}.",
                                 metadata=tfds.core.MetadataDict(path=self.builder_config.path))

  def _split_generators(self, dl_manager):
    cuts = text_folder_cuts(self.builder_config.path)
    return {s: self._generate_examples(s, cuts) for s in SPLITS}

  def _generate_examples(self, split, cuts):
    root = self.builder_config.path
    if cuts is None:
      pieces = ((relative, _read_text(root, relative)) for relative in text_folder_files(root)
                if split_of(relative) == split)
    else:
      pieces = _text_split_pieces(root, cuts, split)
    for relative, text in pieces:
      for i, chunk in enumerate(_paragraph_chunks(text)):
        yield f"{relative}:{i}", {"text": chunk, "path": relative}
