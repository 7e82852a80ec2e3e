"""text_folder's record cutting (the builder's splits are in data_test.py)."""

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
