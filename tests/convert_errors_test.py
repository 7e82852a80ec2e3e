"""Hugging Face interop: every malformed checkpoint or unwritable model is refused with a
message that names the tensor, the key or the setting (needs only safetensors)."""

import os

import numpy as np
import pytest

from transformer.schema import position_config
from transformer.interop import hf
from tests.helpers.hf_files import edit as _edit
from tests.helpers.tiny_models import init_params as _init, ours as _ours


@pytest.fixture
def written(tmp_path):
  cfg = _ours("llama", num_layers=1)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  return str(tmp_path)


def test_error_unknown_architecture(written):
  _edit(written, config=lambda hf: hf.update(model_type="mistral"))
  with pytest.raises(ValueError, match=r"model_type 'mistral'; convertible: \['bert', 'gpt2'"):
    hf.from_hf(written)


def test_error_missing_tensor(written):
  _edit(written, tensors=lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
  with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight' is missing \(it "
                                       r"holds tower/stack/layers_0/ffn/wi_1/kernel\)"):
    hf.from_hf(written)


def test_error_shape_mismatch(written):
  _edit(written, config=lambda hf: hf.update(num_key_value_heads=4))
  with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape "
                                       r"\(8, 16\), which does not fit .*key/kernel of shape "
                                       r"\(16, 4, 4\)"):
    hf.from_hf(written)


def test_error_unexpected_tensor(written):
  _edit(written, tensors=lambda t: t.update({"model.layers.0.extra.weight": np.zeros(3)}))
  with pytest.raises(ValueError, match=r"'model.layers.0.extra.weight' is not part of the llama"):
    hf.from_hf(written)


def test_error_damaged_safetensors_file(written):
  path = os.path.join(written, "model.safetensors")
  with open(path, "r+b") as f:
    f.truncate(300)  # a copy cut short
  with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file "
                                       r"\(.*\); copy it again"):
    hf.from_hf(written)


def test_error_unsupported_rope_type(written):
  _edit(written, config=lambda hf: hf["rope_parameters"].update(rope_type="dynamic"))
  with pytest.raises(ValueError, match=r"rope type 'dynamic' has no equivalent here"):
    hf.from_hf(written)


def test_error_architecture_override(written):
  with pytest.raises(ValueError, match=r"only runtime keys .* not 'num_layers'"):
    hf.from_hf(written, num_layers=3)


@pytest.mark.parametrize("overrides,message", [
    (dict(kind="decoder", position=position_config("alibi")),
     r"no Hugging Face family writes a model.kind='decoder' with position.name='alibi'"),
    (dict(window=8), r"as a Hugging Face llama checkpoint \(the family of a decoder with rope positions\): "
     r"model.window=8 would read back as 0; train with --config.model.KEY=VALUE"),
    (dict(ffn="gelu"), r"llama uses a gated feed-forward; model.ffn='gelu' is not one"),
    # Approximate attention is another function: written as softmax it would compute another.
    (dict(attention="linear"), r"model.attention='linear' would read back as 'softmax'"),
    (dict(attention="block_sparse", attention_chunk=16),
     r"model.attention='block_sparse with attention_chunk=16' would read back as 'softmax'"),
    (("bert", dict(num_token_types=0)),
     r"bert checkpoint.*: bert embeds token types; model.num_token_types=0 has no table; train"),
])
def test_error_model_not_writable(overrides, message, tmp_path):
  family, overrides = overrides if isinstance(overrides, tuple) else ("llama", overrides)
  cfg = _ours(family, **overrides)
  with pytest.raises(ValueError, match=message):
    hf.to_hf(cfg, {"params": {}}, str(tmp_path))


@pytest.mark.parametrize("rope", [dict(truncate=False), dict(attention_factor=1.2),
                                  dict(mscale=0.707), dict(factor=1.0)])
def test_error_unsupported_yarn_variant(rope, tmp_path):
  """YaRN variants ours does not compute (transformers' untruncated ramp, an explicit
  attention factor, DeepSeek's mscale, no extension) are refused, not read as the paper's."""
  cfg = _ours("llama", num_layers=1)  # yarn
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  _edit(str(tmp_path), config=lambda c: c["rope_parameters"].update(rope))
  with pytest.raises(ValueError, match=r"llama: yarn with attention_factor, mscale, "
                                       r"truncate=False or factor <= 1 is not supported"):
    hf.from_hf(str(tmp_path))


@pytest.mark.parametrize("family,setting,message", [
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True),
     r"gpt2: scale_attn_by_inverse_layer_idx=True is not supported"),
    ("gpt2", dict(add_cross_attention=True), r"gpt2: add_cross_attention=True is not supported"),
    ("llama", dict(mlp_bias=True), r"llama: attention_bias and mlp_bias differ"),
    ("bert", dict(position_embedding_type="relative_key"),
     r"bert: position_embedding_type='relative_key'; only 'absolute' is supported"),
    ("bert", dict(is_decoder=True), r"bert: decoder BERT \(is_decoder / add_cross_attention\)"),
    ("t5", dict(scale_decoder_outputs=True),
     r"t5: decoder outputs scaled by d_model\^-0.5 \(v1.0\) with a separate lm_head.weight"),
])
def test_error_a_setting_we_do_not_compute(family, setting, message, tmp_path):
  """A config.json setting that changes what the model computes, which ours cannot, is
  refused rather than converted into another function."""
  cfg = _ours(family, num_layers=1)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  _edit(str(tmp_path), config=lambda c: c.update(setting))
  with pytest.raises(ValueError, match=message):
    hf.from_hf(str(tmp_path))


def test_a_duplicate_tensor_must_equal_the_one_kept(tmp_path):
  """transformers 4 saved T5's tied tables (encoder.embed_tokens.weight beside shared.weight):
  an exact copy is accepted, one that differs is refused (it would be dropped)."""
  cfg = _ours("t5", num_layers=1)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  _edit(str(tmp_path), tensors=lambda t: t.update(
      {"encoder.embed_tokens.weight": t["shared.weight"].copy()}))
  hf.from_hf(str(tmp_path))
  _edit(str(tmp_path), tensors=lambda t: t.update(
      {"encoder.embed_tokens.weight": t["shared.weight"] + 1}))
  with pytest.raises(ValueError, match=r"tensor 'encoder.embed_tokens.weight' differs from "
                                       r"'shared.weight', of which t5 keeps one copy"):
    hf.from_hf(str(tmp_path))
