"""text_folder's record cutting (the builder's splits are in data_test.py)."""

import os

import pytest

from transformer.data import text_folder


@pytest.mark.parametrize("text, pieces", [
    ("aaa\n\nbbb\n\ncc", ["aaa\n\n", "bbb\n\n", "cc"]),  # at blank lines
    ("aaa\nbb\n\ncc\nd", ["aaa\n", "bb\n\n", "cc\nd"]),  # else at newlines
    ("aa bb cc dd e", ["aa bb ", "cc dd ", "e"]),         # a one-line file: at spaces
    ("abcdefghijklm", ["abcdef", "ghijkl", "m"]),         # else at the limit
    ("short", ["short"]),
])
def test_big_files_are_cut_into_records_that_join_back(monkeypatch, text, pieces):
  monkeypatch.setattr(text_folder, "_MAX_RECORD_BYTES", 6)
  chunks = text_folder._paragraph_chunks(text)  # pylint: disable=protected-access
  assert chunks == pieces and "".join(chunks) == text
  assert all(len(c) <= 6 for c in chunks)


def test_path_split_is_pinned():
  """The 90/5/5 path-hash split never changes: prepared copies of a folder stay valid."""
  want = {"doc0.txt": "train", "doc1.txt": "train", "doc2.txt": "train",
          "doc27.txt": "validation", "doc65.txt": "validation", "doc82.txt": "validation",
          "doc55.txt": "test", "doc102.txt": "test", "doc104.txt": "test"}
  assert {p: text_folder.split_of(p) for p in want} == want
  counts = [text_folder.split_of(f"d/{i}.txt") for i in range(4000)]
  assert 0.87 < counts.count("train") / 4000 < 0.93
  assert 0.035 < counts.count("validation") / 4000 < 0.065
  assert 0.035 < counts.count("test") / 4000 < 0.065


@pytest.mark.parametrize("text", ["abcdef", "abcdefghijkl", "aa bb "])
def test_a_text_of_exactly_the_record_limit_is_one_record_per_limit(monkeypatch, text):
  """A text whose remaining length equals the limit is the last record, with no empty one."""
  monkeypatch.setattr(text_folder, "_MAX_RECORD_BYTES", 6)
  chunks = text_folder._paragraph_chunks(text)  # pylint: disable=protected-access
  assert "".join(chunks) == text and all(chunks) and len(chunks) == len(text) // 6


def test_offset_of_visible_crosses_blocks(monkeypatch):
  """The n-th non-whitespace character is found when counting goes block by block, also when
  it is the first of a block."""
  monkeypatch.setattr(text_folder, "_BLOCK", 4)
  text = "ab c\n de  fgh i\tj "
  visible = [i for i, c in enumerate(text) if not c.isspace()]
  assert text_folder._visible(text) == len(visible)  # pylint: disable=protected-access
  for n, at in enumerate(visible):
    assert text_folder._offset_of_visible(text, n) == at, n  # pylint: disable=protected-access
  with pytest.raises(IndexError):
    text_folder._offset_of_visible(text, len(visible))  # pylint: disable=protected-access


def _split_texts(root):
  """Each split's text, from the records of a folder that is split by text."""
  cuts = text_folder.text_folder_cuts(str(root))
  assert cuts is not None  # two files cannot fill three path-hash splits
  pieces = {s: [t for _, t in text_folder._text_split_pieces(str(root), cuts, s)]  # pylint: disable=protected-access
            for s in text_folder.SPLITS}
  assert all(t.strip() for ts in pieces.values() for t in ts)  # no blank record
  return {s: "".join(ts) for s, ts in pieces.items()}


@pytest.mark.parametrize("second", [1, 2, 3, 4, 5])
def test_text_split_cuts_fall_on_exact_character_counts(tmp_path, second):
  """A folder split by text: test holds the last 5% of its non-whitespace characters (at least
  one), validation the 5% before, train the rest; also where a cut falls on a file's first
  character (second=2, 4) or just after a file's last (second=4: validation starts file b)."""
  (tmp_path / "a.txt").write_text("x" * 36 + "\n")
  (tmp_path / "b.txt").write_text(" " + "y" * second + "\n")
  texts = _split_texts(tmp_path)
  visible = {s: len("".join(t.split())) for s, t in texts.items()}
  assert visible == {"train": 36 + second - 4, "validation": 2, "test": 2}
  assert "".join(texts[s] for s in text_folder.SPLITS).split() == ["x" * 36, "y" * second]


@pytest.mark.parametrize("text", ["abc", "ab cde", "a b c d e f g h i"])
def test_a_folder_of_a_few_characters_still_fills_every_split(tmp_path, text):
  """Fewer than 10 non-whitespace characters round 5% to 0: each held-out split still gets one."""
  (tmp_path / "only.txt").write_text(text)
  texts = _split_texts(tmp_path)
  assert all(t.strip() for t in texts.values())
  assert len("".join(texts["test"].split())) == len("".join(texts["validation"].split())) == 1


def test_too_little_text_and_other_files_are_refused_or_skipped(tmp_path):
  """Only *.txt files (subfolders included) are read, and a folder needs one non-whitespace
  character per split."""
  (tmp_path / "sub").mkdir()
  for name in ("a.txt", "notes.md", "sub/b.txt", "sub/c.txt.bak"):
    (tmp_path / name).write_text("a b\n")
  assert text_folder.text_folder_files(str(tmp_path)) == ["a.txt", "sub/b.txt"]
  (tmp_path / "sub" / "b.txt").write_text("\n")
  with pytest.raises(ValueError, match="has 2 non-whitespace character"):
    text_folder.text_folder_cuts(str(tmp_path))


def test_a_rewritten_file_of_the_same_size_names_a_new_dataset(tmp_path):
  """The config name (the prepared copy's directory) hashes each file's size and mtime: an
  edit that keeps the size still rebuilds the data."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  path = tmp_path / "a.txt"
  path.write_text("first text\n")
  name = lambda: text_folder.TextFolder.config_from(
      ml_collections.ConfigDict(dict(path=str(tmp_path)))).name
  before = name()
  path.write_text("other text\n")
  os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
  assert name() != before
