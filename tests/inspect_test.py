"""The inspect tool against the seeds' numbers and the reference implementations' counts."""

import importlib
import json
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from configs.arch import t5_small
from transformer.analysis import model_stats

ROOT = pathlib.Path(__file__).resolve().parents[1]

ARCH = {name: importlib.import_module(f"configs.arch.{name}").get_config()
        for name in ("llama3_8b", "llama3_1_8b", "gpt2_small", "bert_base", "t5_small",
                     "vaswani_base")}


@pytest.fixture(scope="module")
def llama():
  return model_stats.report(ARCH["llama3_8b"], length=131_072)


def test_llama3_8b_numbers_from_the_seed(llama):
  p = llama["params"]
  assert p["total"] == 8_030_261_248
  block = p["per_block"]["tower"]
  assert block["ffn"] == pytest.approx(176e6, rel=0.01)  # "about 176 million weights"
  assert block["attention"] == pytest.approx(42e6, rel=0.01)  # "about 42 million"
  assert p["ffn_share"] == pytest.approx(0.70, abs=0.01)  # "roughly 70%"
  kv = llama["kv_cache"]
  assert kv["bytes_per_token"] == 131_072
  assert kv["bytes_at_length"] / 1e9 == pytest.approx(17, abs=0.3)  # "about 17 GB" at 128k
  assert kv["bytes_at_length_one_kv_per_head"] / 1e9 == pytest.approx(69, abs=0.5)
  assert kv["tokens_where_cache_outweighs_weights"] == pytest.approx(122_000, rel=0.01)
  assert llama["comparisons"] == dict(new_tokens=40, with_cache=820, without_cache=11_480)
  assert llama["rope"]["pairs"] == 64
  assert llama["rope"]["fastest_degrees_per_token"] == pytest.approx(57, abs=0.5)
  assert llama["rope"]["slowest_tokens_per_turn"] == pytest.approx(2.5e6, rel=0.05)


def test_score_entries_at_100k_tokens():
  r = model_stats.report(ARCH["llama3_8b"], length=100_000)
  assert r["score_entries_per_head"]["entries"] == 10_000_000_000


def test_llama3_1_shares_the_count_and_extends_context():
  r = model_stats.report(ARCH["llama3_1_8b"])
  assert r["params"]["total"] == 8_030_261_248
  assert r["kv_cache"]["bytes_at_max_len"] == 131_072 * 131_072


# Hugging Face transformers' model.num_parameters() for these architectures (GPT2LMHeadModel
# "gpt2", BertForMaskedLM "bert-base-uncased", T5ForConditionalGeneration "t5-small",
# LlamaForCausalLM "Meta-Llama-3-8B"); recomputed from transformers below when installed.
HF_COUNTS = {"gpt2_small": 124_439_808, "bert_base": 109_514_298, "t5_small": 60_506_624,
             "llama3_8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_presets_match_reference_parameter_counts(name):
  assert model_stats.count_params(ARCH[name].model)["total"] == HF_COUNTS[name]


def _hf_count(name):
  transformers = pytest.importorskip("transformers", reason="interop extra not installed")
  torch = pytest.importorskip("torch")
  configs = {
      "gpt2_small": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()),
      "bert_base": lambda: transformers.BertForMaskedLM(transformers.BertConfig()),
      "t5_small": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
          vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8)),
      "llama3_8b": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
          vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
          num_attention_heads=32, num_key_value_heads=8)),
  }
  with torch.device("meta"):
    return configs[name]().num_parameters()


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_reference_counts_recomputed_with_transformers(name):
  assert _hf_count(name) == HF_COUNTS[name]


def test_vaswani_base_layers_match_torch_reference():
  torch = pytest.importorskip("torch", reason="interop extra not installed")
  p = model_stats.count_params(ARCH["vaswani_base"].model)
  enc = torch.nn.TransformerEncoderLayer(512, 8, 2048)
  dec = torch.nn.TransformerDecoderLayer(512, 8, 2048)
  size = lambda m: sum(x.numel() for x in m.parameters())
  enc_block, dec_block = p["per_block"]["encoder"], p["per_block"]["decoder"]
  assert enc_block["attention"] + enc_block["ffn"] + enc_block["norms"] == size(enc)
  assert dec_block["attention"] + dec_block["ffn"] + dec_block["norms"] == size(dec)
  assert p["total"] == 37_000 * 512 + 6 * size(enc) + 6 * size(dec)


def test_vaswani_base_is_the_papers_size():
  # Table 3 of the paper lists 65M parameters for the base model; the shared 37k table
  # without final norms gives 63.1M (the paper's count included details it does not state).
  assert model_stats.count_params(ARCH["vaswani_base"].model)["total"] / 1e6 == pytest.approx(
      65, abs=2.5)


def test_flops_per_token_formula():
  cfg = ARCH["gpt2_small"].model
  f = model_stats.flops_per_token(cfg, 1024)
  n = model_stats.count_params(cfg)["non_embedding"]
  assert f["total"] == 6 * n + 6 * 12 * 1024 * 768


def test_comparisons_count_the_triangles():
  for n in (1, 7, 40):
    c = model_stats.comparisons(n)
    assert c["with_cache"] == n * (n + 1) // 2
    assert c["without_cache"] == sum(t * (t + 1) // 2 for t in range(1, n + 1))


def test_cli_json_with_override():
  out = subprocess.run(
      [sys.executable, "-m", "transformer.inspect", "--config", "configs/arch/llama3_8b.py",
       "--json", "--config.model.num_kv_heads=32"],
      capture_output=True, text=True, check=True, cwd=ROOT)
  r = json.loads(out.stdout)
  for key in ("total", "non_embedding"):
    assert key in r["params"]
  assert r["kv_cache"]["bytes_per_token"] == 4 * 131_072  # one KV set per head
  assert "flops_per_token" in r and r["kv_cache"]["bytes_at_max_len"] == 4 * 131_072 * 8192


def test_cli_rejects_unknown_keys():
  out = subprocess.run(
      [sys.executable, "-m", "transformer.inspect", "--config", "configs/arch/gpt2_small.py",
       "--config.model.num_kv_head=1"], capture_output=True, text=True, cwd=ROOT)
  assert out.returncode != 0 and "num_kv_head" in out.stderr


@pytest.mark.parametrize("name,kwargs,message", [
    ("llama3_8b", dict(length=-5), "--length must be >= 1"),
    ("llama3_8b", dict(new_tokens=-3), "--new_tokens >= 0"),
    ("gpt2_small", dict(length=5000), r"exceeds the learned position table \(model.max_len=1024"),
])
def test_impossible_lengths_are_refused(name, kwargs, message):
  with pytest.raises(ValueError, match=message):
    model_stats.report(ARCH[name], **kwargs)


def test_cli_reads_a_run_directory(tmp_path):
  """--workdir reports the model a run was written with: its parameter count is the saved
  parameters' own, and its FLOPs per token are the train command's, at the run's data.seq_len
  (not model.max_len)."""
  import jax
  from transformer.interop import workdirs
  from transformer.model import models
  from transformer.schema import model_config, position_config
  from transformer.training import throughput
  cfg = model_config(kind="decoder", vocab_size=64, d_model=32, num_layers=2, num_heads=4,
                     num_kv_heads=2, d_ff=64, max_len=512, ffn="swiglu",
                     position=position_config("rope"))
  variables = models.make_model(cfg).init(jax.random.key(0), *models.dummy_inputs(cfg, 1, 8))
  run = str(tmp_path / "run")
  workdirs.save_workdir(cfg, {"params": variables["params"]}, run)
  out = subprocess.run([sys.executable, "-m", "transformer.inspect", "--workdir", run, "--json"],
                       capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr
  r = json.loads(out.stdout)
  total = sum(x.size for x in jax.tree.leaves(variables["params"]))
  assert r["params"]["total"] == total
  with open(f"{run}/config.json") as f:
    seq_len = json.load(f)["data"]["seq_len"]
  assert seq_len < cfg.max_len and r["flops_context"] == dict(tokens=seq_len,
                                                              source="data.seq_len")
  assert (r["flops_per_token"], r["flops_per_token_total_params"]) == tuple(
      throughput.flops_per_token(cfg, seq_len, r["params"]["non_embedding"], total, convention)
      for convention in ("non_embedding", "total"))
  # A bare model config has no training context: max_len stands in, as before.
  assert model_stats.report(cfg)["flops_context"] == dict(tokens=512, source="model.max_len")


@pytest.mark.parametrize("args,message", [
    (["--workdir", "nowhere"], "nowhere/config.json not found; --workdir takes a directory"),
    ([], "pass one of --config CONFIG_FILE or --workdir RUN_DIR"),
    (["--workdir", "configs", "--config", "configs/arch/gpt2_small.py"], "pass one of"),
])
def test_cli_needs_one_source(args, message):
  out = subprocess.run([sys.executable, "-m", "transformer.inspect", *args],
                       capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 1 and out.stderr.startswith("error: "), out.stderr
  assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_scanned_encoder_decoder_counts_each_towers_own_depth():
  """Stacked layers carry their depth on the leading axis: an encoder of 4 and a decoder of 1
  (num_layers 2) give the same per-block figures scanned as unscanned."""
  import ml_collections
  cfg = ml_collections.ConfigDict(ARCH["t5_small"].model.to_dict())
  cfg.update(d_model=32, num_heads=2, head_dim=16, d_ff=64, vocab_size=64, num_layers=2,
             num_encoder_layers=4, num_decoder_layers=1)
  plain = model_stats.count_params(cfg)["per_block"]
  cfg.scan_layers = True
  assert model_stats.count_params(cfg)["per_block"] == plain
  assert plain["encoder"]["num_layers"] == 4 and plain["decoder"]["num_layers"] == 1


def test_the_cache_figures_hold_the_source_and_respect_a_window():
  """An encoder-decoder's cache holds its decoder layers' self- and cross-attention K/V (a
  source as long as the target); a sliding window bounds a decoder's, so it may never
  outweigh the weights."""
  t5 = ARCH["t5_small"].model  # 6 decoder layers, 8 heads of 64, bfloat16
  kv = model_stats.report(t5, length=100)["kv_cache"]
  assert kv["bytes_per_token"] == 6 * 2 * (2 * 8 * 64 * 2)
  assert kv["bytes_at_length"] == 100 * kv["bytes_per_token"]
  import ml_collections
  gpt2 = ml_collections.ConfigDict(ARCH["gpt2_small"].model.to_dict())
  gpt2.window = 256
  kv = model_stats.report(gpt2)["kv_cache"]
  assert kv["bytes_at_length"] == 256 * kv["bytes_per_token"]  # max_len 1024, 256 kept
  assert kv["tokens_where_cache_outweighs_weights"] is None
  gpt2.window = 1 << 20  # wider than where the cache crosses the weights: the plain figure
  kv = model_stats.report(gpt2)["kv_cache"]
  assert kv["tokens_where_cache_outweighs_weights"] == -(-kv["param_bytes"] //
                                                         kv["bytes_per_token"])


def test_cli_points_a_hugging_face_directory_to_the_converter(tmp_path):
  (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
  out = subprocess.run([sys.executable, "-m", "transformer.inspect", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
  want = (f"error: --workdir: {tmp_path} is a Hugging Face checkpoint (model_type 'gpt2'), "
          f"not a run directory; convert it first: python -m transformer.convert --from_hf "
          f"{tmp_path} --to ")
  assert out.stderr.startswith(want), out.stderr


def _arch(name):
  import importlib
  return importlib.import_module(f"configs.arch.{name}").get_config().model


def test_non_embedding_counts_follow_kaplans_convention():
  """Kaplan et al. exclude the token table, learned positions and an untied output projection:
  GPT-2 small 124,439,808 - 50257*768 - 1024*768; Llama 3 8B 8,030,261,248 - 2*128256*4096."""
  gpt2 = model_stats.count_params(_arch("gpt2_small"))
  assert gpt2["total"] == 124_439_808
  assert gpt2["non_embedding"] == 124_439_808 - 50257 * 768 - 1024 * 768
  llama = model_stats.count_params(_arch("llama3_8b"))
  assert llama["total"] == 8_030_261_248
  assert llama["non_embedding"] == 8_030_261_248 - 2 * 128256 * 4096


def test_flops_attention_term_counts_cross_attention_and_the_window():
  """6 n_attn_layers n_ctx d_attn: an encoder-decoder's decoder layers attend twice (self and
  cross), and a sliding window caps n_ctx."""
  import ml_collections
  t5 = _arch("t5_small")  # 6 + 6 layers, 8 heads of 64
  f = model_stats.flops_per_token(t5, 512, non_embedding=1, params_total=2)
  assert f["attention"] == 6 * (6 + 2 * 6) * 512 * 512
  assert f["total"] == 6 * 1 + f["attention"]
  assert f["total_params_convention"] == 6 * 2 + f["attention"]
  gpt2 = ml_collections.ConfigDict(_arch("gpt2_small").to_dict())
  gpt2.window = 256
  f = model_stats.flops_per_token(gpt2, 1024, non_embedding=10, params_total=20)
  assert f["attention"] == 6 * 12 * 256 * 768 and f["dense"] == 60


def test_an_encoder_decoders_cache_counts_its_decoder_layers():
  """The decode cache is the decoder's: an uneven T5 (6 encoder layers, 2 decoder layers, as
  T5 v1.0 checkpoints may have) caches 2 layers of self- and cross-attention K/V."""
  t5 = ml_collections.ConfigDict(t5_small.get_config().model.to_dict())
  t5.num_decoder_layers = 2  # 8 heads of 64, bfloat16
  assert model_stats.kv_cache_bytes(t5, 10, 2, encoder_length=10) == 2 * 2 * 8 * 64 * 2 * 20
  assert model_stats.report(t5, length=100)["kv_cache"]["bytes_per_token"] == (
      2 * 2 * (2 * 8 * 64 * 2))
