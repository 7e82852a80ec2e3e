"""Tokenizers with one interface and the same special ids.

Every tokenizer has pad 0, bos 1, eos 2, mask 3, so models, losses and the
pipeline never ask which tokenizer they got. encode/decode never add specials.
encode_continuation encodes text that follows other text: without the space a sentencepiece
model (or a tokenizer.json with a prefix space) puts before every text it encodes, which
would make "k1 = " + "v2" read "k1 =  v2".
"""

import functools
import hashlib
import io
import os
import tempfile

import numpy as np
import sentencepiece as spm

from transformer.data import builders
from transformer.data import external_tokenizers
from transformer.data import grammar
from transformer.data import sources

PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3
NUM_SPECIAL = 4  # ids below this are never produced by encode (except sentencepiece's <unk>, id 4)


class BytesTokenizer:
  """UTF-8 bytes shifted past the specials: byte b has id b + 4."""

  vocab_size = 256 + NUM_SPECIAL
  pad_id, bos_id, eos_id, mask_id = PAD_ID, BOS_ID, EOS_ID, MASK_ID

  def encode(self, text: str) -> list[int]:
    return (np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + NUM_SPECIAL).tolist()

  encode_continuation = encode

  def decode(self, ids) -> str:
    ids_N = np.asarray(ids, np.int64)
    ids_N = ids_N[ids_N >= NUM_SPECIAL] - NUM_SPECIAL
    return ids_N.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

  @functools.cached_property
  def token_bytes_2V(self) -> np.ndarray:
    """Bytes each token adds to the text: 1 per byte token, 0 for the specials (row 1, a
    document's first token, is the same)."""
    return np.broadcast_to((np.arange(self.vocab_size) >= NUM_SPECIAL).astype(np.int32),
                           (2, self.vocab_size))


class SentencePieceTokenizer:
  """A sentencepiece model trained with this project's special ids."""

  def __init__(self, model_path: str):
    self.model_path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)
    self.vocab_size = self._sp.get_piece_size()
    self.pad_id, self.bos_id, self.eos_id = self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id()
    self.mask_id = self._sp.piece_to_id("<mask>")
    if (self.pad_id, self.bos_id, self.eos_id, self.mask_id) != (PAD_ID, BOS_ID, EOS_ID, MASK_ID):
      raise ValueError(f"{model_path} has special ids pad/bos/eos/mask = {self.pad_id}/"
                       f"{self.bos_id}/{self.eos_id}/{self.mask_id}, expected 0/1/2/3")

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_continuation(self, text: str) -> list[int]:
    return self._continuation.encode(text)

  @functools.cached_property
  def _continuation(self) -> spm.SentencePieceProcessor:
    """The same model without the dummy-prefix space (as Hugging Face's non-legacy Llama
    tokenizer does it: the flag lives in the model's normalizer spec)."""
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(self._sp.serialized_model_proto())
    proto.normalizer_spec.add_dummy_prefix = False
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in ids])

  @functools.cached_property
  def token_bytes_2V(self) -> np.ndarray:
    """Row 0: bytes each piece adds to the text ("▁" is a space, <0xNN> one byte, control
    and unknown pieces none); row 1: as a document's first piece, whose leading "▁" is
    the dummy prefix sentencepiece adds to every text and drops on decode."""
    out = np.zeros((2, self.vocab_size), np.int32)
    for i in range(self.vocab_size):
      if self._sp.is_control(i) or self._sp.is_unknown(i) or self._sp.is_unused(i):
        continue
      if self._sp.is_byte(i):
        out[:, i] = 1
        continue
      out[0, i] = len(self._sp.id_to_piece(i).replace("▁", " ").encode())
      out[1, i] = len(self._sp.decode([i]).encode())
    return out


def planned_vocab_size(data_config) -> int | None:
  """The vocabulary size the tokenizer will have, known from the config before any training
  (sentencepiece: at most data.vocab_size); None when only its files tell (huggingface)."""
  if data_config.tokenizer == "bytes":
    return BytesTokenizer.vocab_size
  if data_config.tokenizer == "sentencepiece":
    return data_config.vocab_size
  return None


def _training_texts(data_config, max_chars: int):
  """Train-split texts in a fixed pseudo-random order, up to `max_chars` characters."""
  dataset = sources.load(data_config, "train").shuffle(seed=0)
  total = 0
  for i in range(len(dataset)):
    for text in sources.record_texts(dataset[i]):
      yield text
      total += len(text)
    if total >= max_chars:
      return


def _train_sentencepiece(data_config, model_writer) -> None:
  spm.SentencePieceTrainer.train(
      sentence_iterator=_training_texts(data_config, data_config.tokenizer_train_chars),
      model_writer=model_writer, vocab_size=data_config.vocab_size, model_type="unigram",
      pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=NUM_SPECIAL,
      # A control symbol is never matched in text, so a literal "<mask>" stays plain text.
      control_symbols=["<mask>"],
      # Exact round trips (code keeps its whitespace, any unicode falls back to bytes).
      byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
      allow_whitespace_only_pieces=True, split_digits=True, character_coverage=1.0,
      # Whole documents are the "sentences"; one thread and no sampling make training
      # deterministic, so every host of a multi-host job derives the same model.
      max_sentence_length=1 << 30, input_sentence_size=0, num_threads=1,
      hard_vocab_limit=False, minloglevel=2)


def train_sentencepiece(data_config, model_path: str) -> None:
  """Trains on a sample of the train split and writes `model_path` atomically."""
  model = io.BytesIO()
  try:
    _train_sentencepiece(data_config, model)
  except RuntimeError as e:
    # e.g. "Vocabulary size is smaller than required_chars. 200 vs 294.": the corpus' distinct
    # characters plus the specials need more pieces than asked for.
    message = str(e).split("] ")[-1].split(" Increase")[0]
    raise ValueError(f"sentencepiece cannot train data.vocab_size={data_config.vocab_size} on "
                     f"{data_config.name!r} ({message}): raise data.vocab_size") from None
  # A temp file + rename means a concurrent reader never sees half a model.
  directory = os.path.dirname(model_path) or "."
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as f:
    f.write(model.getvalue())
  os.replace(f.name, model_path)


def sentencepiece_path(data_config, cache_dir: str) -> str:
  # The name pins what the model was trained on, so a changed config trains a new one.
  key = "|".join(str(data_config.get(k)) for k in ("name", "size", "task", "min_length",
                                                    "max_length", "num_pairs", "path",
                                                    "text_key", "tokenizer_train_chars"))
  if data_config.name == "grammar_corpus" and (
      builders.doc_sentences(data_config) != grammar.DOC_SENTENCES):
    key += f"|doc_sentences={data_config.doc_sentences}"  # the default keeps its old name
  if data_config.name == "grammar_corpus" and builders.max_doc_tokens(data_config):
    key += f"|max_doc_tokens={builders.max_doc_tokens(data_config)}"
  digest = hashlib.sha256(key.encode()).hexdigest()[:10]
  return os.path.join(cache_dir, f"sentencepiece-{data_config.name}-{data_config.vocab_size}"
                                 f"-{digest}.model")


def _bytes(data_config, cache_dir):
  del data_config, cache_dir
  return BytesTokenizer()


def _sentencepiece(data_config, cache_dir):
  if not cache_dir:
    raise ValueError("tokenizer 'sentencepiece' needs a cache_dir (the training workdir)")
  path = sentencepiece_path(data_config, cache_dir)
  if not os.path.exists(path):
    train_sentencepiece(data_config, path)
  return SentencePieceTokenizer(path)


HuggingFaceTokenizer = external_tokenizers.HuggingFaceTokenizer
TiktokenTokenizer = external_tokenizers.TiktokenTokenizer


def _huggingface(data_config, cache_dir):
  path = data_config.get("tokenizer_path", "")
  if not path:  # a converted checkpoint's files, which transformer.convert put in tokenizer/
    return HuggingFaceTokenizer(cache_dir or "")
  if os.path.isdir(path):
    path = os.path.join(path, external_tokenizers.HF_FILE)
  kept = external_tokenizers.kept_copy(path, cache_dir, external_tokenizers.HF_FILE,
                                       "data.tokenizer_path")
  special = os.path.join(os.path.dirname(path), external_tokenizers.SPECIAL_IDS_FILE)
  if cache_dir and os.path.exists(special):  # its special ids travel with it
    external_tokenizers.kept_copy(special, cache_dir, external_tokenizers.SPECIAL_IDS_FILE,
                                  "the special ids file")
  return HuggingFaceTokenizer(kept)


def _tiktoken(data_config, cache_dir):
  path = data_config.get("tokenizer_path", "")
  if not path:
    return external_tokenizers.TiktokenTokenizer(name=data_config.get("tokenizer_name", ""))
  return external_tokenizers.TiktokenTokenizer(ranks_path=external_tokenizers.kept_copy(
      path, cache_dir, external_tokenizers.TIKTOKEN_FILE, "data.tokenizer_path"))


TOKENIZERS = {"bytes": _bytes, "sentencepiece": _sentencepiece, "huggingface": _huggingface,
              "tiktoken": _tiktoken}


def get_tokenizer(data_config, cache_dir: str | None = None):
  """The tokenizer named by data_config.tokenizer; sentencepiece is trained once per cache_dir."""
  if data_config.tokenizer not in TOKENIZERS:
    raise ValueError(f"unknown tokenizer {data_config.tokenizer!r}; valid: {sorted(TOKENIZERS)}")
  return TOKENIZERS[data_config.tokenizer](data_config, cache_dir)


def token_bytes(tokenizer) -> dict:
  """What the eval step needs for bits per byte: the tokenizer's [2, V] table of bytes per
  token (row 1: as a document's first token) and its BOS id."""
  return {"token_bytes_2V": np.asarray(tokenizer.token_bytes_2V, np.int32),
          "bos_id": np.int32(tokenizer.bos_id)}
