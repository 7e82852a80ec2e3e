"""Tokenizers users bring: a Hugging Face `tokenizer.json` (the `tokenizers` package, no torch)
and tiktoken encodings, behind the interface of tokenizers.py (encode/encode_continuation/decode
without specials, pad/bos/eos/mask ids, vocab_size, token_bytes_2V).

Their special ids are their own (GPT-2's <|endoftext|> is 50256), not this project's 0/1/2/3:
the data layer and inference read them from the tokenizer, never assume them.

A run keeps a copy of the file it trained with in its workdir's tokenizer/ folder, so
generate, resume and init_from use that copy even when the original has moved or changed.
"""

import functools
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

# Token strings looked up, in order, for each special a tokenizer.json does not name in a
# special_ids.json beside it. GPT-2 style BPEs have only <|endoftext|>: it is BOS and EOS.
SPECIAL_NAMES = {
    "bos": ("<s>", "<bos>", "[CLS]", "<|begin_of_text|>", "<|startoftext|>", "<|endoftext|>"),
    "eos": ("</s>", "<eos>", "[SEP]", "<|end_of_text|>", "<|endoftext|>"),
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),  # none: EOS (pad rows weigh 0)
    "mask": ("<mask>", "[MASK]"),                           # none: masked LM is refused
}
HF_FILE, TIKTOKEN_FILE, SPECIAL_IDS_FILE = "tokenizer.json", "tokenizer.tiktoken", "special_ids.json"


def kept_copy(source: str, cache_dir: str | None, name: str, key: str) -> str:
  """The run's own copy of a user's tokenizer file: made from `source` on first use, then
  preferred (the original may move). A changed original is refused, never silently used."""
  kept = os.path.join(cache_dir, name) if cache_dir else None
  if kept and os.path.exists(kept):
    if source and os.path.isfile(source) and _digest(source) != _digest(kept):
      raise ValueError(f"{key}={source} differs from {kept}, the tokenizer this run was "
                       f"trained with: point {key} at {kept}, or train in a new workdir")
    return kept
  if not source or not os.path.isfile(source):
    raise ValueError(f"{key}={source!r} is not a file: give the path of a {name} "
                     + ("(or a folder holding one)" if name == HF_FILE else "file"))
  if not kept:
    return source
  os.makedirs(cache_dir, exist_ok=True)
  # A temp file + rename: a concurrent reader (another host) never sees half a file.
  with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False, suffix=".tmp") as f:
    with open(source, "rb") as src:
      shutil.copyfileobj(src, f)
  os.replace(f.name, kept)
  return kept


def _digest(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


@functools.cache
def _byte_decoder() -> dict[str, int]:
  """GPT-2's byte-level alphabet inverted: each character of a ByteLevel token is one byte
  (printable bytes map to themselves, the rest to U+0100 onward)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


def _steps(component: dict | None, key: str) -> list[dict]:
  """A tokenizer.json component's steps: a Sequence's list under `key`, else itself."""
  component = component or {}
  return component.get(key, []) if component.get("type") == "Sequence" else [component]


def out_of_range(ids: dict, size: int) -> dict:
  """The special ids (role -> id) that a tokenizer of `size` tokens does not have."""
  return {role: i for role, i in ids.items() if i is not None and not 0 <= i < size}


class HuggingFaceTokenizer:
  """A `tokenizer.json` read with Hugging Face `tokenizers`. Special ids: a special_ids.json
  beside it ({"pad": .., "bos": .., "eos": .., "mask": ..}, as transformer.convert writes for
  a converted checkpoint), else the tokens of SPECIAL_NAMES it has."""

  def __init__(self, path: str):
    try:
      import tokenizers  # pylint: disable=g-import-not-at-top  # the light `hf` extra
    except ImportError:
      raise ValueError("tokenizer 'huggingface' needs the tokenizers package: "
                       "pip install -e '.[hf]'") from None
    if os.path.isdir(path):
      path = os.path.join(path, HF_FILE)
    if not os.path.exists(path):
      raise ValueError(f"tokenizer 'huggingface' reads {path}, which does not exist: set "
                       f"data.tokenizer_path to a tokenizer.json (or its folder), or copy one "
                       f"there")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
      raise ValueError(f"{path} is not a Hugging Face tokenizer.json "
                       f"({str(e).splitlines()[0][:120]})") from None
    # A special token's string inside a document is text (as tiktoken's disallowed_special=()
    # makes it): matched as the special id, "<|endoftext|>" in a document would end it there.
    self._tok.encode_special_tokens = True
    self.path = path
    self.vocab_size = self._tok.get_vocab_size()
    ids = {}
    special = os.path.join(os.path.dirname(path), SPECIAL_IDS_FILE)
    if os.path.exists(special):
      with open(special) as f:
        ids.update({k: v for k, v in json.load(f).items() if v is not None})
    for role, names in SPECIAL_NAMES.items():
      if ids.get(role) is None:
        ids[role] = next((self._tok.token_to_id(n) for n in names
                          if self._tok.token_to_id(n) is not None), None)
    for role in ("bos", "eos"):
      if ids[role] is None:
        raise ValueError(f"{path} has no {role} token (looked for {', '.join(SPECIAL_NAMES[role])}):"
                         f" write its id into {special} as {{\"{role}\": ID, ...}}")
    outside = out_of_range(ids, self.vocab_size)
    if outside:  # a checkpoint's config can name ids its tokenizer does not have
      raise ValueError(f"special ids {outside} are outside {path}'s {self.vocab_size} tokens: "
                       f"write the right ones into {special} as {{\"eos\": ID, ...}}")
    self.bos_id, self.eos_id, self.mask_id = ids["bos"], ids["eos"], ids["mask"]
    self.pad_id = ids["eos"] if ids["pad"] is None else ids["pad"]

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_continuation(self, text: str) -> list[int]:
    return self._continuation.encode(text, add_special_tokens=False).ids

  @functools.cached_property
  def _continuation(self):
    """The same tokenizer without the space it puts before a text (Metaspace's prepend,
    sentencepiece's dummy prefix; ByteLevel's add_prefix_space; a Prepend normalizer), where
    that is what continues a text exactly. A tokenizer that splits on whitespace first (T5's
    and ALBERT's WhitespaceSplit) drops a prompt's trailing space and needs that prefix as the
    word boundary: it keeps it. Chosen by trying both on two prompts: a continuation must
    decode as the prompt and its continuation encoded as one text do."""
    stripped = self._without_prefix_space()
    if stripped is self._tok:
      return self._tok

    def continues(tok):
      return all(self.decode(self.encode(head) + tok.encode(tail, add_special_tokens=False).ids)
                 == self.decode(self.encode(head + tail))
                 for head, tail in (("a = ", "b"), ("a", " b")))
    return stripped if continues(stripped) and not continues(self._tok) else self._tok

  def _without_prefix_space(self):
    import tokenizers  # pylint: disable=g-import-not-at-top
    spec = json.loads(self._tok.to_str())

    def strip(step):
      if not isinstance(step, dict):
        return step, False
      kind = step.get("type")
      if kind == "Prepend":
        return None, True
      if kind == "Metaspace" and (step.get("prepend_scheme", "always") != "never"
                                  or step.get("add_prefix_space")):
        return step | {"prepend_scheme": "never", "add_prefix_space": False}, True
      if kind == "ByteLevel" and step.get("add_prefix_space"):
        return step | {"add_prefix_space": False}, True
      if kind == "Sequence":
        key = "normalizers" if "normalizers" in step else "pretokenizers"
        parts = [strip(p) for p in step.get(key, [])]
        return (step | {key: [p for p, _ in parts if p is not None]},
                any(changed for _, changed in parts))
      return step, False

    changed = False
    for key in ("normalizer", "pre_tokenizer"):
      spec[key], changed_here = strip(spec.get(key))
      changed |= changed_here
    if not changed:
      return self._tok
    tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
    tok.encode_special_tokens = True
    return tok

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  @functools.cached_property
  def token_bytes_2V(self) -> np.ndarray:
    """Row 0: the UTF-8 bytes each token adds to decoded text; row 1: the same as a
    document's first token (a Metaspace decoder drops its leading space there)."""
    V = self.vocab_size
    out = np.zeros((2, V), np.int32)
    added = self._tok.get_added_tokens_decoder()
    tokens = [self._tok.id_to_token(i) or "" for i in range(V)]
    spec = json.loads(self._tok.to_str())
    if any(p.get("type") == "ByteLevel" for p in _steps(spec.get("decoder"), "decoders")):
      chars = _byte_decoder()
      out[:] = [sum(c in chars for c in t) for t in tokens]
      if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space")
             for p in _steps(spec.get("pre_tokenizer"), "pretokenizers")):
        # A document's first "Ġ" is the space add_prefix_space put there (decode keeps it).
        out[1] -= [t.startswith("Ġ") for t in tokens]
    else:
      # Decoding in context: a token's bytes after an anchor token, and alone (document start).
      anchor = self.encode("a")[-1:]
      alone = self._tok.decode_batch([[i] for i in range(V)], skip_special_tokens=False)
      pairs = self._tok.decode_batch([anchor + [i] for i in range(V)], skip_special_tokens=False)
      base = len(self._tok.decode(anchor).encode())
      out[0] = [len(p.encode()) - base for p in pairs]
      out[1] = [len(a.encode()) for a in alone]
      fallback = [i for i, t in enumerate(tokens) if len(t) == 6 and t.startswith("<0x")
                  and t.endswith(">")]
      out[:, fallback] = 1  # byte-fallback pieces <0xNN>: one byte each, alone or not
    for i, token in added.items():
      if i < V:
        out[:, i] = 0 if token.special else len(token.content.encode())
    return out


_TIKTOKEN_HINT = ("on a machine with network run `TIKTOKEN_CACHE_DIR=DIR python -c \"import "
                  "tiktoken; tiktoken.get_encoding('{name}')\"`, copy DIR here and set "
                  "TIKTOKEN_CACHE_DIR=DIR, or set data.tokenizer_path to a .tiktoken ranks file")


def _tiktoken_cache_dir() -> str:
  # tiktoken.load.read_file_cached's own order.
  return (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
          or os.path.join(tempfile.gettempdir(), "data-gym-cache"))


class _NotCached(Exception):
  pass


def _offline_encoding(tiktoken, name: str):
  """tiktoken.get_encoding(name) from local files only: training never downloads (offline
  clusters; every host must see the same file), so a file tiktoken would fetch is an error."""
  import tiktoken.load  # pylint: disable=g-import-not-at-top
  fetch = tiktoken.load.read_file

  def local_only(blobpath):
    if "://" in blobpath:
      raise _NotCached(blobpath)
    return fetch(blobpath)
  tiktoken.load.read_file = local_only
  try:
    return tiktoken.get_encoding(name)
  except _NotCached as e:
    url = str(e)
    raise ValueError(
        f"tiktoken encoding {name!r} is not on this machine: tiktoken looked in "
        f"{_tiktoken_cache_dir()} for {hashlib.sha1(url.encode()).hexdigest()} (its copy of "
        f"{url}); " + _TIKTOKEN_HINT.format(name=name)) from None
  finally:
    tiktoken.load.read_file = fetch


class TiktokenTokenizer:
  """A tiktoken encoding by name (data.tokenizer_name: gpt2, cl100k_base, ...), or a BPE ranks
  file in tiktoken's format (data.tokenizer_path), split with GPT-2's pattern and given
  <|endoftext|> as its last id. <|endoftext|> is BOS, EOS and pad; there is no mask token."""

  def __init__(self, name: str = "", ranks_path: str = ""):
    try:
      import tiktoken  # pylint: disable=g-import-not-at-top  # the `hf` extra
    except ImportError:
      raise ValueError("tokenizer 'tiktoken' needs the tiktoken package: "
                       "pip install -e '.[hf]'") from None
    if ranks_path:
      import tiktoken.load  # pylint: disable=g-import-not-at-top
      from tiktoken_ext import openai_public  # pylint: disable=g-import-not-at-top
      try:
        ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
      except Exception as e:  # malformed lines raise ValueError / binascii.Error
        raise ValueError(f"{ranks_path} is not a tiktoken ranks file (lines of base64 token "
                         f"and rank): {e}") from None
      self._enc = tiktoken.Encoding(
          name=os.path.basename(ranks_path), pat_str=openai_public.r50k_pat_str,
          mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})
    else:
      if not name:
        raise ValueError(f"tokenizer 'tiktoken' needs data.tokenizer_name (one of "
                         f"{tiktoken.list_encoding_names()}) or data.tokenizer_path")
      if name not in tiktoken.list_encoding_names():
        raise ValueError(f"unknown tiktoken encoding data.tokenizer_name={name!r}; "
                         f"valid: {tiktoken.list_encoding_names()}")
      self._enc = _offline_encoding(tiktoken, name)
    self.vocab_size = self._enc.n_vocab
    self._special = set(self._enc.special_tokens_set)
    self._special_ids = {self._enc.encode_single_token(t) for t in self._special}
    self.bos_id = self.eos_id = self.pad_id = self._enc.eot_token
    self.mask_id = None

  def encode(self, text: str) -> list[int]:
    # A literal "<|endoftext|>" in a document is text, not the special token.
    return self._enc.encode(text, disallowed_special=())

  encode_continuation = encode  # byte-level, no prefix space

  def decode(self, ids) -> str:
    return self._enc.decode([int(i) for i in ids if int(i) not in self._special_ids])

  @functools.cached_property
  def token_bytes_2V(self) -> np.ndarray:
    """Bytes per token (specials and unused ids 0); byte-level, so no document-start change."""
    lengths = np.zeros(self.vocab_size, np.int32)
    for i in range(self.vocab_size):
      if i not in self._special_ids:
        try:
          lengths[i] = len(self._enc.decode_single_token_bytes(i))
        except KeyError:  # ids the encoding leaves unused (cl100k_base's gaps)
          pass
    return np.stack([lengths, lengths])
