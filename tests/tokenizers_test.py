"""Tokenizers users bring, from the command line: a Hugging Face tokenizer.json and a tiktoken
ranks file train, evaluate (with bits per byte) and generate; their mistakes are one line."""

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest

from transformer import data
from transformer.data import external_tokenizers, sources

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LM = os.path.join(ROOT, "configs", "lm.py") + ":size=xs"


def _texts(data_dir):
  config = data.default_config()
  config.size, config.data_dir = "tiny", data_dir
  return [t for r in sources.load(config, "train") for t in sources.record_texts(r)]


def _hf_folder(data_dir, folder) -> str:
  """A byte-level BPE (GPT-2 style, only <|endoftext|> as a special) trained on a few KB."""
  import tokenizers as hf
  tok = hf.Tokenizer(hf.models.BPE())
  tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf.decoders.ByteLevel()
  texts = _texts(data_dir)[:40]
  assert 2_000 < sum(map(len, texts)) < 20_000
  tok.train_from_iterator(texts, hf.trainers.BpeTrainer(
      vocab_size=320, special_tokens=["<|endoftext|>"],
      initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()))
  os.makedirs(folder)
  tok.save(os.path.join(folder, "tokenizer.json"))
  return folder


def _ranks_file(path) -> str:
  """A tiktoken BPE ranks file: every byte, then a few merges."""
  ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"in", b" a", b"at"]
  with open(path, "w") as f:
    f.writelines(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks))
  return path


def _cli(cwd, module, *args, env=None):
  env = dict(os.environ if env is None else env, PYTHONPATH=ROOT, PYTHONIOENCODING="utf-8")
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        cwd=cwd, env=env, timeout=600)


def _train(cwd, workdir, data_dir, *sets, steps=20):
  flags = [f"--config.data.data_dir={data_dir}", "--config.data.size=tiny",
           "--config.data.seq_len=64", "--config.model.vocab_size=512",
           f"--config.train.steps={steps}", "--config.train.batch_size=8",
           "--config.train.eval_every=10", "--config.train.eval_batches=1",
           "--config.train.log_every=5", *[f"--config.{s}" for s in sets]]
  return _cli(cwd, "transformer.train", "--config", LM, "--workdir", workdir, *flags)


def _one_error_line(proc) -> str:
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), (
      proc.stderr[-2000:])
  return lines[0]


@pytest.mark.slow
def test_huggingface_tokenizer_json_trains_reports_bpb_and_generates(tmp_path, data_dir):
  folder = _hf_folder(data_dir, str(tmp_path / "my_tokenizer"))
  proc = _train(tmp_path, "run", data_dir, "data.tokenizer=huggingface",
                f"data.tokenizer_path={folder}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  evals = [r for r in rows if "eval_bpb" in r]
  assert [r["step"] for r in evals] == [10, 20]
  for r in evals:  # several bytes per token: bpb is well below the loss in bits per token
    assert 0 < r["eval_bpb"] < 0.6 * r["eval_loss"] / 0.6931
  assert "bpb)" in proc.stdout  # the progress line's eval part
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  assert summary["final_eval_bpb"] == evals[-1]["eval_bpb"]
  assert rows[-1]["loss"] < rows[0]["loss"]

  # The run kept its own copy: generate works after the original is gone.
  kept = tmp_path / "run" / "tokenizer" / "tokenizer.json"
  assert kept.read_bytes() == open(os.path.join(folder, "tokenizer.json"), "rb").read()
  shutil.rmtree(folder)
  out = _cli(tmp_path, "transformer.generate", "--workdir", "run", "--prompt", "The cat",
             "--max_new_tokens", "8")
  assert out.returncode == 0, out.stderr[-2000:]
  tok = data.get_tokenizer(json_config(tmp_path / "run"), str(tmp_path / "run" / "tokenizer"))
  assert tok.eos_id == tok.bos_id == 0  # <|endoftext|>, found by name
  assert out.stdout.strip() and "<|endoftext|>" not in out.stdout


def json_config(workdir):
  import ml_collections
  return ml_collections.ConfigDict(json.load(open(workdir / "config.json"))).data


@pytest.mark.slow
def test_tiktoken_ranks_file_trains(tmp_path, data_dir):
  ranks = _ranks_file(str(tmp_path / "tiny.tiktoken"))
  proc = _train(tmp_path, "run", data_dir, "data.tokenizer=tiktoken",
                f"data.tokenizer_path={ranks}", steps=10)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  assert summary["final_eval_bpb"] > 0
  assert os.path.exists(tmp_path / "run" / "tokenizer" / "tokenizer.tiktoken")


@pytest.mark.slow
@pytest.mark.parametrize("sets,want", [
    (["data.tokenizer=huggingface", "data.tokenizer_path=/no/such/tokenizer.json"],
     "data.tokenizer_path='/no/such/tokenizer.json' is not a file"),
    (["data.tokenizer=huggingface", "data.tokenizer_path=BAD"], "is not a Hugging Face"),
    (["data.tokenizer=tiktoken", "data.tokenizer_name=cl100k_base"],
     "tiktoken encoding 'cl100k_base' is not on this machine: tiktoken looked in"),
    (["data.tokenizer=tiktoken", "data.tokenizer_name=gpt3"],
     "unknown tiktoken encoding data.tokenizer_name='gpt3'; valid: ["),
    (["data.tokenizer=tiktoken"], "tokenizer 'tiktoken' needs data.tokenizer_name"),
])
def test_bad_tokenizer_is_one_line_and_writes_nothing(tmp_path, data_dir, sets, want):
  (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
  sets = [s.replace("=BAD", f"={tmp_path / 'bad.json'}") for s in sets]
  env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path / "empty_cache"))
  flags = [f"--config.{s}" for s in sets] + [f"--config.data.data_dir={data_dir}",
                                             "--config.data.size=tiny"]
  proc = _cli(tmp_path, "transformer.train", "--config", LM, "--workdir", "run", *flags,
              env=env)
  assert want in _one_error_line(proc)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
def test_masked_lm_with_a_tokenizer_without_a_mask_token_is_one_line(tmp_path, data_dir):
  ranks = _ranks_file(str(tmp_path / "tiny.tiktoken"))
  mlm = os.path.join(ROOT, "configs", "mlm.py")
  proc = _cli(tmp_path, "transformer.train", "--config", mlm, "--workdir", "run",
              "--config.data.tokenizer=tiktoken", f"--config.data.tokenizer_path={ranks}",
              f"--config.data.data_dir={data_dir}", "--config.data.size=tiny",
              "--config.model.vocab_size=512")
  assert "objective 'mlm' needs a mask token" in _one_error_line(proc)
  assert not os.path.exists(tmp_path / "run")


def test_special_ids_are_found_by_name_or_read_beside_the_file(tmp_path, data_dir):
  folder = _hf_folder(data_dir, str(tmp_path / "tok"))
  tok = external_tokenizers.HuggingFaceTokenizer(folder)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id) == (0, 0, 0, None)
  with open(os.path.join(folder, "special_ids.json"), "w") as f:
    json.dump({"bos": 5, "mask": 6}, f)
  tok = external_tokenizers.HuggingFaceTokenizer(os.path.join(folder, "tokenizer.json"))
  assert (tok.bos_id, tok.eos_id, tok.mask_id) == (5, 0, 6)
  # GPT2Config's default ids beside a small tokenizer: named, not a broadcast error later.
  with open(os.path.join(folder, "special_ids.json"), "w") as f:
    json.dump({"bos": 50256, "eos": 50256, "pad": None}, f)
  with pytest.raises(ValueError, match=r"special ids \{'bos': 50256, 'eos': 50256\} are outside"):
    external_tokenizers.HuggingFaceTokenizer(folder)


def test_a_special_tokens_string_in_a_document_is_text(tmp_path, data_dir):
  """'<|endoftext|>' written in a document stays text, as on the tiktoken path: encoded as the
  EOS id it would end the document there, vanish from decode and from the byte count."""
  from transformer.data import featurize
  tok = external_tokenizers.HuggingFaceTokenizer(_hf_folder(data_dir, str(tmp_path / "tok")))
  text = "the docs say <|endoftext|> ends a document"
  ids = tok.encode(text)
  assert tok.eos_id not in ids and tok.decode(ids) == text
  table = tok.token_bytes_2V
  assert table[1, ids[0]] + table[0, ids[1:]].sum() == len(text.encode())
  tokens_N, _ = featurize.lm_tokens({"text": text}, tok)
  assert tok.eos_id not in tokens_N[1:-1]


def test_a_changed_original_is_refused_not_silently_used(tmp_path, data_dir):
  folder = _hf_folder(data_dir, str(tmp_path / "tok"))
  config = data.default_config()
  config.tokenizer, config.tokenizer_path = "huggingface", folder
  data.get_tokenizer(config, str(tmp_path / "run" / "tokenizer"))
  with open(os.path.join(folder, "tokenizer.json"), "a") as f:
    f.write(" ")
  with pytest.raises(ValueError, match="differs from .*the tokenizer this run was trained"):
    data.get_tokenizer(config, str(tmp_path / "run" / "tokenizer"))


def _prefixing_tokenizers(directory):
  """tokenizer.json files that put a space before every text they encode: sentencepiece-style
  Metaspace (always), Llama-3-era Metaspace (first), T5's WhitespaceSplit + Metaspace, legacy
  Llama (a Prepend normalizer) and a byte-level BPE with add_prefix_space; and one that does
  not."""
  import tokenizers as hf
  texts = [f"k{i}:v{i * 7 % 100} k{i + 1}:v{i % 9} ? k{i} = v{i * 7 % 100}" for i in range(60)]
  texts += ["The keys to the cabinet are on the table.", "The cat sleeps."] * 5
  unigram = lambda: hf.trainers.UnigramTrainer(vocab_size=120, special_tokens=["<s>", "</s>"],
                                              unk_token="<s>")
  kinds = {}
  for scheme in ("always", "first"):
    tok = hf.Tokenizer(hf.models.Unigram())
    tok.pre_tokenizer = hf.pre_tokenizers.Metaspace(prepend_scheme=scheme)
    tok.decoder = hf.decoders.Metaspace(prepend_scheme=scheme)
    kinds[f"metaspace_{scheme}"] = (tok, unigram())
  tok = hf.Tokenizer(hf.models.Unigram())  # T5 / ALBERT: words split first, then Metaspace
  tok.pre_tokenizer = hf.pre_tokenizers.Sequence([hf.pre_tokenizers.WhitespaceSplit(),
                                                  hf.pre_tokenizers.Metaspace()])
  tok.decoder = hf.decoders.Metaspace()
  kinds["whitespace_split"] = (tok, unigram())
  tok = hf.Tokenizer(hf.models.Unigram())
  tok.normalizer = hf.normalizers.Sequence([hf.normalizers.Prepend("▁"),
                                            hf.normalizers.Replace(" ", "▁")])
  tok.decoder = hf.decoders.Sequence([hf.decoders.Replace("▁", " "), hf.decoders.Fuse(),
                                      hf.decoders.Strip(" ", 1, 0)])
  kinds["prepend_normalizer"] = (tok, unigram())
  for prefix in (True, False):
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    tok.decoder = hf.decoders.ByteLevel()
    kinds[f"byte_level_prefix_{prefix}"] = (tok, hf.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()))
  paths = {}
  for name, (tok, trainer) in kinds.items():
    tok.train_from_iterator(texts, trainer)
    paths[name] = os.path.join(directory, name + ".json")
    tok.save(paths[name])
  return paths


def test_a_prompts_answer_is_encoded_as_a_continuation(tmp_path, data_dir):
  """An lm row of an inputs/targets record decodes to inputs + " = " + targets, with no second
  space where the tokenizer's dummy prefix would go, and the answer's bytes are its own; the
  scorer encodes a continuation the same way."""
  from transformer.data import featurize, tokenizers
  from transformer.inference import scoring
  config = data.default_config()
  config.update(dict(name="kv_retrieval", size="tiny", data_dir=data_dir,
                     tokenizer="sentencepiece", vocab_size=300, tokenizer_train_chars=30_000))
  kinds = {"sentencepiece": data.get_tokenizer(config, str(tmp_path / "sp")),
           "bytes": tokenizers.BytesTokenizer()}
  for name, path in _prefixing_tokenizers(str(tmp_path)).items():
    kinds[name] = external_tokenizers.HuggingFaceTokenizer(path)
  record = {"inputs": "k12:v84 k13:v3 ? k12", "targets": "v84"}
  for name, tok in kinds.items():
    tokens_N, prompt_len = featurize.lm_tokens(record, tok)
    text = tok.decode(tokens_N[1:-1])
    if name == "byte_level_prefix_True":  # its decoder keeps the added space, as in HF
      assert text[0] == " " and tok.token_bytes_2V[1, tokens_N[1]] == len(
          tok.decode(tokens_N[1:2]).encode()) - 1
      text = text[1:]
    assert text == "k12:v84 k13:v3 ? k12 = v84", name
    answer_N = tokens_N[1 + prompt_len:-1]
    # WhitespaceSplit drops the prompt's trailing space: the answer's "▁v" carries it.
    assert tok.token_bytes_2V[0, answer_N].sum() == (4 if name == "whitespace_split" else 3), name
    assert tok.decode(answer_N) == "v84", name
  # The scorer scores the answer as the training row holds it: the same log-probability as the
  # row's answer positions in a direct forward pass (sentencepiece's dummy prefix included).
  import jax
  from transformer.model import models
  from transformer.schema import model_config
  tok = kinds["sentencepiece"]
  cfg = model_config(vocab_size=tok.vocab_size, d_model=32, num_layers=1, num_heads=2, d_ff=64)
  model = models.make_model(cfg)
  params = model.init(jax.random.key(0), *models.dummy_inputs(cfg))["params"]
  logp, _ = scoring.Scorer(cfg, params).continuation_scores(
      tok, [record["inputs"] + data.PROMPT_SEPARATOR], [record["targets"]], batch_size=1)
  tokens_N, prompt_len = featurize.lm_tokens(record, tok)
  lp_LV = jax.nn.log_softmax(model.apply({"params": params}, tokens_N[None, :-1]))[0]
  answer = range(prompt_len, len(tokens_N) - 2)  # target j is token j + 1; EOS left out
  assert logp[0] == pytest.approx(float(sum(lp_LV[j, tokens_N[j + 1]] for j in answer)),
                                  abs=1e-4)


def test_bytes_tokenizer_keeps_the_nul_byte():
  """Byte 0 is token 4, the first non-special id: it round-trips and counts one byte."""
  from transformer.data import tokenizers
  tok = tokenizers.BytesTokenizer()
  assert tok.encode("a\x00b") == [ord("a") + 4, 4, ord("b") + 4]
  assert tok.decode([1, *tok.encode("a\x00b"), 2, 0]) == "a\x00b"
  table = tok.token_bytes_2V
  assert (table[:, :4] == 0).all() and (table[:, 4:] == 1).all()


def test_sentencepiece_model_name_changes_with_everything_it_is_trained_on(tmp_path):
  """The cached model's file name pins each knob that changes its training text or size, so a
  changed config trains a new model instead of reusing a stale one; the default corpus keeps
  its old name."""
  from transformer.data import tokenizers
  base = data.default_config()
  base.update(dict(tokenizer="sentencepiece", data_dir=str(tmp_path)))
  path = lambda **kw: tokenizers.sentencepiece_path(_with(base, **kw), "cache")
  changes = [dict(name="kv_retrieval"), dict(size="tiny"), dict(task="sort"),
             dict(min_length=2), dict(max_length=9), dict(num_pairs=3), dict(path="/x"),
             dict(text_key="body"), dict(tokenizer_train_chars=5), dict(vocab_size=300),
             dict(doc_sentences="1,1"), dict(max_doc_tokens=400)]
  names = [path(**c) for c in changes]
  assert len(set(names + [path()])) == len(changes) + 1
  assert path(doc_sentences="3,7") == path()
  # Pinned: the default corpus' model keeps the name existing runs' workdirs hold.
  assert path() == os.path.join("cache", "sentencepiece-grammar_corpus-8000-2921720ec5.model")


def _with(config, **overrides):
  config = config.copy_and_resolve_references()
  config.update(overrides)
  return config


def test_special_ids_file_travels_with_the_kept_copy(tmp_path, data_dir):
  """get_tokenizer copies a special_ids.json found beside data.tokenizer_path into the run's
  tokenizer/ folder with the tokenizer.json, so the run's copy alone has the same ids."""
  folder = _hf_folder(data_dir, str(tmp_path / "tok"))
  with open(os.path.join(folder, "special_ids.json"), "w") as f:
    json.dump({"bos": 5, "mask": 6}, f)
  config = data.default_config()
  config.tokenizer, config.tokenizer_path = "huggingface", folder
  kept = str(tmp_path / "run" / "tokenizer")
  tok = data.get_tokenizer(config, kept)
  assert (tok.bos_id, tok.eos_id, tok.mask_id) == (5, 0, 6)
  assert sorted(os.listdir(kept)) == ["special_ids.json", "tokenizer.json"]
  shutil.rmtree(folder)
  config.tokenizer_path = ""  # a converted or resumed run reads only its own copy
  again = data.get_tokenizer(config, kept)
  assert (again.bos_id, again.eos_id, again.mask_id) == (5, 0, 6)


def test_sentencepiece_trains_on_a_fixed_shuffled_sample(data_dir):
  """The training sample is the train split in a fixed pseudo-random order (not its first
  records), cut once max_chars characters are reached."""
  from transformer.data import tokenizers
  config = data.default_config()
  config.size, config.data_dir = "tiny", data_dir
  sample = list(tokenizers._training_texts(config, 3000))  # pylint: disable=protected-access
  assert sample == list(tokenizers._training_texts(config, 3000))  # pylint: disable=protected-access
  assert sum(map(len, sample[:-1])) < 3000 <= sum(map(len, sample))
  exact = sum(map(len, sample[:3]))
  assert list(tokenizers._training_texts(config, exact)) == sample[:3]  # pylint: disable=protected-access
  stored = [r["text"] for r in sources.load(config, "train")]
  assert sample != stored[:len(sample)] and set(sample) <= set(stored)


def _word_level(folder, tokens, special_ids=None, byte_fallback=False):
  """A tiny tokenizer.json built by hand: a BPE over `tokens` (plus <0xNN> byte pieces with
  byte_fallback), no merges; `special_ids` is written beside it."""
  import tokenizers as hf
  vocab = {t: i for i, t in enumerate(tokens)}
  if byte_fallback:
    vocab |= {f"<0x{b:02X}>": len(tokens) + b for b in range(256)}
  tok = hf.Tokenizer(hf.models.BPE(vocab, [], byte_fallback=byte_fallback))
  tok.decoder = hf.decoders.Sequence([hf.decoders.ByteFallback(), hf.decoders.Fuse()])
  os.makedirs(folder)
  tok.save(os.path.join(folder, "tokenizer.json"))
  if special_ids is not None:
    with open(os.path.join(folder, "special_ids.json"), "w") as f:
      json.dump(special_ids, f)
  return folder


def test_special_ids_edge_cases(tmp_path):
  """Without a pad token pad is EOS; a tokenizer without an EOS is refused; the last id is in
  range, one past it is not."""
  tokens = ["<s>", "</s>", "a", "b"]
  tok = external_tokenizers.HuggingFaceTokenizer(_word_level(str(tmp_path / "plain"), tokens))
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id) == (0, 1, 1, None)
  with pytest.raises(ValueError, match="has no eos token"):
    external_tokenizers.HuggingFaceTokenizer(_word_level(str(tmp_path / "no_eos"), ["<s>", "a"]))
  last = external_tokenizers.HuggingFaceTokenizer(
      _word_level(str(tmp_path / "last"), tokens, {"mask": 3}))
  assert last.mask_id == 3
  with pytest.raises(ValueError, match=r"special ids \{'mask': 4\} are outside"):
    external_tokenizers.HuggingFaceTokenizer(
        _word_level(str(tmp_path / "past"), tokens, {"mask": 4}))


def test_byte_fallback_pieces_count_one_byte_each(tmp_path):
  """A character the vocabulary lacks is encoded as <0xNN> byte pieces (Llama-style byte
  fallback): each adds one byte, though alone one decodes to U+FFFD (three bytes)."""
  tok = external_tokenizers.HuggingFaceTokenizer(_word_level(
      str(tmp_path / "fallback"), ["<s>", "</s>", "a", "b"], byte_fallback=True))
  text = "aé€b"
  ids = tok.encode(text)
  assert tok.decode(ids) == text and len(ids) == 2 + 2 + 3
  table = tok.token_bytes_2V
  assert table[1, ids[0]] + table[0, ids[1:]].sum() == len(text.encode())
