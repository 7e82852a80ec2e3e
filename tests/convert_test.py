"""Hugging Face interop: logits and greedy tokens equal to transformers', exact round trips.

The comparisons need the `interop` extra (torch==2.13.0 CPU and transformers); they build tiny
randomly initialized models from configs (no download) and skip without the extra. The round
trip from our parameters, the sharded format and the error messages need only safetensors.
"""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformer.inference import decode
from transformer.interop import hf, hf_families, workdirs
from transformer.model import models
from tests.helpers.tiny_models import init_params as _init, ours as _ours

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

SKIP_REASON = ("needs the interop extra (pip install -e '.[interop]': torch==2.13.0 CPU, "
               "transformers) to compare with the reference implementation")
GENERATED = 20


def _hf():
  """(torch, transformers), or skip the test."""
  try:
    import torch
    import transformers
  except ImportError:
    pytest.skip(SKIP_REASON)
  transformers.logging.set_verbosity_error()
  return torch, transformers


# ---------------------------------------------------------------------------------------------
# Tiny reference models, saved with save_pretrained. Small dims, GQA, biases, and settings that
# differ from the defaults (epsilons, rope scalings) so a dropped setting shows in the logits.

def _gpt2(T):
  return T.GPT2LMHeadModel(T.GPT2Config(
      vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=48, layer_norm_epsilon=1e-4,
      bos_token_id=None, eos_token_id=None))


def _llama3(T):  # GQA, untied head, "llama3" scaling that reaches the test's positions
  return T.LlamaForCausalLM(T.LlamaConfig(
      vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
      rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16}))


def _llama_tied(T):  # MHA, tied head (Llama 3.2 style), linear scaling, biases
  return T.LlamaForCausalLM(T.LlamaConfig(
      vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
      tie_word_embeddings=True, attention_bias=True, mlp_bias=True, bos_token_id=None,
      eos_token_id=None, rope_parameters={"rope_type": "linear", "rope_theta": 1000.0,
                                          "factor": 2.0}))


def _bert(T):
  return T.BertForMaskedLM(T.BertConfig(
      vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=48, max_position_embeddings=48, type_vocab_size=2))


def _bert_untied(T):  # a separate head: transformers reads decoder.bias, not predictions.bias
  import torch
  model = T.BertForMaskedLM(T.BertConfig(
      vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
      intermediate_size=48, max_position_embeddings=48, tie_word_embeddings=False))
  with torch.no_grad():  # as fine-tuning leaves it; a fresh bias is zeros and hides a swap
    model.cls.predictions.decoder.bias.normal_()
  return model


def _bert_pretraining(T):  # pooler and next-sentence head, like bert-base-uncased's checkpoint
  return T.BertForPreTraining(T.BertConfig(
      vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
      intermediate_size=48, max_position_embeddings=48, hidden_act="gelu_new"))


def _t5_v10(T):  # ReLU, tied head scaled by d_model^-0.5, uneven depths
  return T.T5ForConditionalGeneration(T.T5Config(
      vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1,
      num_heads=4, feed_forward_proj="relu", eos_token_id=None, decoder_start_token_id=0))


def _t5_v11(T):  # gated GELU; the separate lm_head is added to the file below
  return T.T5ForConditionalGeneration(T.T5Config(
      vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
      relative_attention_num_buckets=16, relative_attention_max_distance=20,
      feed_forward_proj="gated-gelu", tie_word_embeddings=False, eos_token_id=None,
      decoder_start_token_id=0))


REFERENCES = {"gpt2": _gpt2, "llama3": _llama3, "llama_tied": _llama_tied, "bert": _bert,
              "bert_untied": _bert_untied, "bert_pretraining": _bert_pretraining, "t5_v10": _t5_v10, "t5_v11": _t5_v11}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """name -> (HF model loaded back from its directory, directory), built once per module."""
  built = {}

  def get(name):
    if name not in built:
      torch, T = _hf()
      torch.manual_seed(0)
      path = str(tmp_path_factory.mktemp(name))
      hf = REFERENCES[name](T)
      with torch.no_grad():  # fresh biases are 0 and norm scales 1: a wrong bias would pass
        for p in hf.parameters():
          p.add_(0.1 * torch.randn_like(p))
      # Sharded with an index, as large checkpoints are published.
      hf.save_pretrained(path, max_shard_size="20KB" if name == "llama3"
                                          else "5GB")
      if name == "t5_v11":  # T5 v1.1 checkpoints carry a head separate from the embedding
        _add_separate_t5_head(path)
      auto = {"bert": T.AutoModelForMaskedLM, "bert_untied": T.AutoModelForMaskedLM,
              "bert_pretraining": T.BertForPreTraining,
              "t5_v10": T.AutoModelForSeq2SeqLM, "t5_v11": T.AutoModelForSeq2SeqLM}
      model = auto.get(name, T.AutoModelForCausalLM).from_pretrained(path).eval()
      built[name] = (model, path)
    return built[name]
  return get


def _add_separate_t5_head(path):
  tensors = load_file(os.path.join(path, "model.safetensors"))
  shape = tensors["shared.weight"].shape
  tensors["lm_head.weight"] = np.random.RandomState(1).normal(0, 1, shape).astype(np.float32)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  hf.update(tie_word_embeddings=False, scale_decoder_outputs=False)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f)


def _tokens(cfg, length=12, batch=2, seed=0):
  return np.random.RandomState(seed).randint(0, cfg.vocab_size, (batch, length)).astype(np.int32)


def _hf_logits(hf_model, *tokens):
  torch, _ = _hf()
  with torch.no_grad():
    if len(tokens) == 2:
      out = hf_model(input_ids=torch.tensor(tokens[0]), decoder_input_ids=torch.tensor(tokens[1]))
    else:
      out = hf_model(input_ids=torch.tensor(tokens[0]))
  logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
  return logits.numpy()


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_logits_match_transformers(reference, name):
  hf_model, path = reference(name)
  cfg, variables = hf.from_hf(path)
  tokens = (_tokens(cfg),) if cfg.kind != "encoder_decoder" else (_tokens(cfg),
                                                                   _tokens(cfg, 7, seed=1))
  ours = np.asarray(models.make_model(cfg).apply(variables, *tokens))
  ref = _hf_logits(hf_model, *tokens)
  assert ours.shape == ref.shape
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 0.1  # not trivially small logits


def test_bert_pooler_matches(reference):
  torch, _ = _hf()
  hf_model, path = reference("bert_pretraining")
  cfg, variables = hf.from_hf(path)
  assert cfg.pooler
  tokens = _tokens(cfg)
  _, state = models.make_model(cfg).apply(variables, tokens, mutable=["intermediates"])
  with torch.no_grad():
    ref = hf_model.bert(input_ids=torch.tensor(tokens)).pooler_output.numpy()
  np.testing.assert_allclose(np.asarray(state["intermediates"]["pooled"][0]), ref, atol=1e-5)


def test_rope_scaling_is_visible(reference):
  """The llama3 test would catch a dropped scaling: without it the logits move by far more
  than the tolerance."""
  _, path = reference("llama3")
  cfg, variables = hf.from_hf(path)
  tokens = _tokens(cfg, 32)
  scaled = models.make_model(cfg).apply(variables, tokens)
  cfg.position.scaling = "none"
  plain = models.make_model(cfg).apply(variables, tokens)
  assert np.abs(np.asarray(scaled) - np.asarray(plain)).max() > 1e-3


def _greedy(cfg, variables, prompt_BP, n):
  """Greedy decoding by full forward passes over a fixed-size buffer (one compile). Causal
  attention means the zeros after position t do not change its logits."""
  model = models.make_model(cfg)
  B, P = prompt_BP.shape
  if cfg.kind == "encoder_decoder":
    step = jax.jit(lambda buf: model.apply(variables, prompt_BP, buf))
    buf, start = np.zeros((B, n + 1), np.int32), 1  # decoder starts from pad = 0, as T5 does
  else:
    step = jax.jit(lambda buf: model.apply(variables, buf))
    buf, start = np.concatenate([prompt_BP, np.zeros((B, n), np.int32)], axis=1), P
  for t in range(start, start + n):
    buf[:, t] = np.asarray(jnp.argmax(step(buf)[:, t - 1], axis=-1))
  return buf[:, start:]


def _hf_greedy(torch, hf_model, cfg, prompt):
  """The GENERATED tokens transformers' greedy `generate` adds after `prompt` (after the
  decoder's start token for an encoder-decoder, whose `prompt` is the encoder input)."""
  with torch.no_grad():
    out = hf_model.generate(torch.tensor(prompt), attention_mask=torch.ones(prompt.shape),
                            do_sample=False, max_new_tokens=GENERATED,
                            min_new_tokens=GENERATED, eos_token_id=None,
                            pad_token_id=0).numpy()
  return out[:, 1:] if cfg.kind == "encoder_decoder" else out[:, prompt.shape[1]:]


@pytest.mark.parametrize("name", ["gpt2", "llama3", "t5_v10", "t5_v11"])
def test_greedy_generation_matches_transformers(reference, name):
  torch, _ = _hf()
  hf_model, path = reference(name)
  cfg, variables = hf.from_hf(path)
  prompt = _tokens(cfg, 6)
  ref = _hf_greedy(torch, hf_model, cfg, prompt)
  assert ref.shape == (2, GENERATED)
  np.testing.assert_array_equal(_greedy(cfg, variables, prompt, GENERATED), ref)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "t5_v10", "t5_v11"])
def test_kv_cache_generation_matches_transformers(reference, name):
  """decode.generate (prefill + cached steps) on the converted model gives the same tokens."""
  torch, _ = _hf()
  hf_model, path = reference(name)
  cfg, variables = hf.from_hf(path)
  prompt = _tokens(cfg, 6)
  ref = _hf_greedy(torch, hf_model, cfg, prompt)
  model = models.make_model(cfg)
  if cfg.kind == "encoder_decoder":  # the decoder starts from pad = 0, as T5 does
    ours = decode.generate(model, variables["params"], [[0]] * len(prompt),
                           max_new_tokens=GENERATED, stop_tokens=(),
                           encoder_inputs=prompt.tolist())
  else:
    ours = decode.generate(model, variables["params"], prompt.tolist(),
                           max_new_tokens=GENERATED, stop_tokens=())
  np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_round_trip_from_transformers_is_exact(reference, name, tmp_path):
  """HF -> ours -> HF gives the same tensors, which transformers loads to the same logits."""
  torch, T = _hf()
  hf_model, path = reference(name)
  cfg, variables = hf.from_hf(path)
  hf.to_hf(cfg, variables, str(tmp_path))
  original = hf.Checkpoint(path, hf_families.FAMILIES[json.load(
      open(os.path.join(path, "config.json")))["model_type"]])
  written = load_file(os.path.join(tmp_path, "model.safetensors"))
  kept = {n for n in original.names if not any(
      re.search(p, n) for p in original.family.ignored)}
  if name == "bert_pretraining":  # the next-sentence head is not part of our model
    kept = {n for n in kept if not n.startswith("cls.seq_relationship")}
  assert set(written) == kept
  mirrors = hf._mirrors(original.family, cfg)  # unused by transformers: written as a copy
  for n, x in written.items():
    np.testing.assert_array_equal(x, written[mirrors[n]] if n in mirrors else original.get(n),
                                  err_msg=n)
  if name != "bert_pretraining":
    again = type(hf_model).from_pretrained(str(tmp_path)).eval()
    tokens = (_tokens(cfg),) if cfg.kind != "encoder_decoder" else (_tokens(cfg), _tokens(cfg))
    np.testing.assert_array_equal(_hf_logits(again, *tokens), _hf_logits(hf_model, *tokens))


# ---------------------------------------------------------------------------------------------
# Without transformers: our parameters -> HF format -> ours, formats and errors.

@pytest.mark.parametrize("family,overrides", [
    ("gpt2", {}), ("llama", dict(scan_layers=True, param_dtype="bfloat16")), ("bert", {}),
    ("t5", {})])
def test_round_trip_from_ours_is_exact(family, overrides, tmp_path):
  cfg = _ours(family, **overrides)
  variables = _init(cfg)
  hf.to_hf(cfg, variables, str(tmp_path), max_shard_bytes=4096)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")  # sharded
  runtime = {k: cfg[k] for k in ("scan_layers", "param_dtype")}
  back_cfg, back = hf.from_hf(str(tmp_path), **runtime)
  assert hf._arch(back_cfg) == hf._arch(cfg)
  flat = lambda v: jax.tree_util.tree_leaves_with_path(v["params"])
  assert [p for p, _ in flat(back)] == [p for p, _ in flat(variables)]
  for (path, a), (_, b) in zip(flat(back), flat(variables)):
    assert a.dtype == b.dtype, path
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                  err_msg=jax.tree_util.keystr(path))


# ---------------------------------------------------------------------------------------------
# The published-architecture presets are writable, and transformers counts the same parameters.

PRESETS = ("gpt2_small", "bert_base", "t5_small", "llama3_8b", "llama3_1_8b")


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_match_transformers_parameter_counts(preset):
  import importlib
  cfg = importlib.import_module(f"configs.arch.{preset}").get_config().model
  hf_cfg = hf.hf_config(cfg)  # raises if the preset is not exactly a HF architecture
  ours = sum(int(np.prod(s.shape)) for s in hf._param_shapes(cfg).values())
  torch, T = _hf()
  config = T.AutoConfig.for_model(**hf_cfg)
  with torch.device("meta"):
    model = getattr(T, hf_cfg["architectures"][0])(config)
  assert ours == model.num_parameters()


def _save_word_tokenizer(path, words):
  """A word-level tokenizer.json (the `tokenizers` library, no download) for a tiny model."""
  tokenizers = pytest.importorskip("tokenizers", reason=SKIP_REASON)
  vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + words)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
  tok.add_special_tokens(["<pad>", "<s>", "</s>"])
  tok.save(os.path.join(path, "tokenizer.json"))


@pytest.mark.parametrize("name", ["gpt2", "t5_v10"])
def test_generate_from_a_converted_checkpoint(reference, name, tmp_path):
  """--from_hf into a run directory, then transformer.generate with the model's own
  tokenizer and special ids, from the command line."""
  import subprocess
  import sys
  _, path = reference(name)
  words = ["the", "keys", "to", "cabinet", "are", "lost"]
  _save_word_tokenizer(path, words)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=root, check=True,
                                     capture_output=True, text=True).stdout
  line = run("transformer.convert", "--from_hf", path, "--to", str(tmp_path / "run"))
  assert line.strip().endswith(
      "parameters; tokenizer files tokenizer.json, generation_config.json copied"), line
  with open(tmp_path / "run" / "tokenizer" / "special_ids.json") as f:
    ids = json.load(f)
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  if name == "t5_v10":  # T5's decoder starts from its pad id
    assert ids["bos"] == hf["decoder_start_token_id"] == hf["pad_token_id"]
  out = run("transformer.generate", "--workdir", str(tmp_path / "run"), "--prompt",
            "the keys to the cabinet", "--max_new_tokens", "5")
  # The same greedy continuation from transformers, decoded by the same tokenizer.
  torch, T = _hf()
  from transformer.data import tokenizers
  tok = tokenizers.HuggingFaceTokenizer(str(tmp_path / "run" / "tokenizer"))
  prompt = tok.encode("the keys to the cabinet")
  model, _ = reference(name)
  with torch.no_grad():
    if name == "t5_v10":
      ids = model.generate(torch.tensor([prompt + [tok.eos_id]]), max_new_tokens=5,
                           do_sample=False, decoder_start_token_id=tok.bos_id)[0, 1:]
    else:
      ids = model.generate(torch.tensor([[tok.bos_id] + prompt]), max_new_tokens=5,
                           do_sample=False, pad_token_id=0)[0, len(prompt) + 1:]
  ids = ids.tolist()
  ids = ids[:ids.index(tok.eos_id)] if tok.eos_id in ids else ids
  assert out.strip() == tok.decode(ids).strip()


def test_a_model_only_checkpoint_says_where_its_tokenizer_goes(reference, tmp_path):
  """A checkpoint without tokenizer files converts, and the convert line says where the
  model's tokenizer.json must go; generate asks for it there, and runs once it is there."""
  import shutil
  import subprocess
  import sys
  _, path = reference("gpt2")
  bare, run = str(tmp_path / "bare"), str(tmp_path / "run")
  os.makedirs(bare)
  for name in ("config.json", "model.safetensors", "generation_config.json"):
    shutil.copyfile(os.path.join(path, name), os.path.join(bare, name))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  call = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=root,
                                      capture_output=True, text=True)
  done = call("transformer.convert", "--from_hf", bare, "--to", run)
  tokenizer_dir = os.path.join(run, "tokenizer")
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip().endswith(
      f"no tokenizer.json in {bare} (copied generation_config.json): put the model's "
      f"tokenizer.json in {tokenizer_dir}/ before generating (transformers' AutoTokenizer "
      f"save_pretrained writes one), or fine-tune with another --config.data.tokenizer"
  ), done.stdout
  generate = ("transformer.generate", "--workdir", run, "--prompt", "the keys",
              "--max_new_tokens", "3")
  done = call(*generate)
  assert done.returncode == 1 and done.stderr.strip() == (
      f"error: tokenizer 'huggingface' reads {tokenizer_dir}/tokenizer.json, which does not "
      f"exist: set data.tokenizer_path to a tokenizer.json (or its folder), or copy one there")
  _save_word_tokenizer(tokenizer_dir, ["the", "keys"])
  done = call(*generate)
  assert done.returncode == 0, done.stderr


def test_a_bytes_tokenizer_run_round_trips_with_its_tokenizer(tmp_path):
  """A run trained on the built-in bytes tokenizer, exported and imported back, generates:
  the export names the tokenizer and its special ids in config.json."""
  import subprocess
  import sys
  from transformer.training import checkpoint
  from transformer.data import tokenizers
  cfg = _ours("llama", num_layers=1, vocab_size=tokenizers.BytesTokenizer.vocab_size)
  run, hf, back = (str(tmp_path / n) for n in ("run", "hf", "back"))
  workdirs.save_workdir(cfg, _init(cfg), run)
  with open(os.path.join(run, "config.json")) as f:
    config = json.load(f)
  config["data"]["tokenizer"] = "bytes"  # as transformer.train leaves a bytes run
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump(config, f)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for args in (["--from", run, "--to_hf", hf], ["--from_hf", hf, "--to", back]):
    line = subprocess.run([sys.executable, "-m", "transformer.convert", *args], cwd=root,
                          check=True, capture_output=True, text=True).stdout
  assert line.strip().endswith("; tokenizer: the built-in 'bytes', recorded in config.json")
  with open(os.path.join(hf, "config.json")) as f:
    written = json.load(f)
  assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (1, 2, 0)
  config, _, params, tokenizer = checkpoint.load_for_inference(back)
  assert config.data.tokenizer == "bytes" and isinstance(tokenizer, tokenizers.BytesTokenizer)
  assert tokenizer.decode(tokenizer.encode("The keys")) == "The keys"
