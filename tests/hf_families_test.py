"""Hugging Face interop: configs and checkpoints as other transformers versions and the Hub
wrote them (keys left out, transformers 4's names and layouts, the original gpt2 and t5-small
files) read as the same model; settings that are a family's own round-trip (needs only
safetensors, and transformers for its config defaults)."""

import json
import os

import jax
import numpy as np
import pytest

from tests.helpers.hf_files import edit as _edit
from tests.helpers.tiny_models import init_params as _init, ours as _ours
from transformer.interop import hf
from transformer.schema import position_config


# --- candidates ------------------------------------------------------------------------------

@pytest.mark.parametrize("scaling", [
    dict(scaling="llama3", scaling_factor=8.0, original_max_len=16, low_freq_factor=1.0,
         high_freq_factor=4.0),
    dict(scaling="yarn", scaling_factor=4.0, original_max_len=16, beta_fast=16.0,
         beta_slow=2.0)])
def test_a_transformers_4_llama_config_reads_as_the_same_model(scaling, tmp_path):
  """transformers 4.x wrote RoPE as a top-level rope_theta and a rope_scaling dict, with no
  rope_parameters (Llama 3.x checkpoints on the Hub): both are read, so the model is the same."""
  cfg = _ours("llama", num_layers=1, position=position_config("rope", theta=500.0, **scaling))
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  _edit(str(tmp_path), config=lambda c: c.pop("rope_parameters"))
  back, _ = hf.from_hf(str(tmp_path))
  assert hf._arch(back) == hf._arch(cfg)


def test_a_base_model_checkpoint_without_the_head_prefix_converts(tmp_path):
  """The original `gpt2` checkpoint (saved from GPT2Model) names its tensors without
  GPT2LMHeadModel's "transformer." prefix, and its config.json predates
  tie_word_embeddings: it reads as the same tied model and parameters."""
  cfg = _ours("gpt2")
  variables = _init(cfg)
  hf.to_hf(cfg, variables, str(tmp_path))
  _edit(str(tmp_path), config=lambda c: c.pop("tie_word_embeddings"),
        tensors=lambda t: t.update({k.removeprefix("transformer."): t.pop(k) for k in list(t)}))
  back_cfg, back = hf.from_hf(str(tmp_path))
  assert back_cfg.tie_embeddings and hf._arch(back_cfg) == hf._arch(cfg)
  jax.tree.map(np.testing.assert_array_equal, back["params"], variables["params"])


def test_yarn_betas_left_out_take_the_papers_defaults(tmp_path):
  """A yarn rope_parameters without beta_fast / beta_slow means transformers' (and the
  paper's) 32 and 1."""
  cfg = _ours("llama", num_layers=1, position=position_config(
      "rope", scaling="yarn", scaling_factor=4.0, original_max_len=16))
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  def drop(c):
    for key in ("rope_parameters", "rope_scaling"):
      c[key].pop("beta_fast"), c[key].pop("beta_slow")
  _edit(str(tmp_path), config=drop)
  back, _ = hf.from_hf(str(tmp_path))
  assert (back.position.beta_fast, back.position.beta_slow) == (32.0, 1.0)


def test_parameters_are_cast_to_the_param_dtype(tmp_path):
  """A bfloat16 checkpoint imports as float32 parameters unless param_dtype says otherwise
  (the model config records float32: parameters of another dtype would not match it)."""
  cfg = _ours("llama", num_layers=1, param_dtype="bfloat16")
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  back_cfg, back = hf.from_hf(str(tmp_path))
  assert back_cfg.param_dtype == "float32"
  assert {str(x.dtype) for x in jax.tree.leaves(back)} == {"float32"}
  _, kept = hf.from_hf(str(tmp_path), param_dtype="bfloat16")
  assert {str(x.dtype) for x in jax.tree.leaves(kept)} == {"bfloat16"}


@pytest.mark.parametrize("tie,scale", [(True, True), (True, False), (False, False)])
def test_t5_tying_and_logit_scaling_round_trip(tie, scale, tmp_path):
  """T5 v1.0 (tied, logits scaled by d_model^-0.5), a tied head without the scaling
  (transformers 5's scale_decoder_outputs=False) and v1.1 (separate head) each export and
  read back as themselves."""
  cfg = _ours("t5", tie_embeddings=tie, scale_tied_logits=scale)
  variables = _init(cfg)
  hf.to_hf(cfg, variables, str(tmp_path))
  back_cfg, back = hf.from_hf(str(tmp_path))
  assert (back_cfg.tie_embeddings, back_cfg.scale_tied_logits) == (tie, scale)
  assert hf._arch(back_cfg) == hf._arch(cfg)
  jax.tree.map(np.testing.assert_array_equal, back["params"], variables["params"])


def test_an_original_t5_config_is_v1_0_with_scaled_logits(tmp_path):
  """t5-small's config.json predates tie_word_embeddings and scale_decoder_outputs: without
  them T5 is v1.0, a tied head scaled by d_model^-0.5 (transformers 4's reading)."""
  cfg = _ours("t5", tie_embeddings=True, scale_tied_logits=True)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  _edit(str(tmp_path), config=lambda c: [c.pop(k) for k in ("tie_word_embeddings",
                                                           "scale_decoder_outputs")])
  back, _ = hf.from_hf(str(tmp_path))
  assert back.tie_embeddings and back.scale_tied_logits


def test_an_untied_bert_saved_by_transformers_4_reads_its_bias(tmp_path):
  """transformers 4 saved an untied BERT head's bias as cls.predictions.bias only (decoder.bias
  linked to it): that tensor stands in for the missing cls.predictions.decoder.bias."""
  cfg = _ours("bert", num_layers=1, tie_embeddings=False)
  variables = _init(cfg)
  hf.to_hf(cfg, variables, str(tmp_path))
  _edit(str(tmp_path), tensors=lambda t: t.pop("cls.predictions.decoder.bias"))
  _, back = hf.from_hf(str(tmp_path))
  np.testing.assert_array_equal(back["params"]["head"]["bias"], variables["params"]["head"]["bias"])


def test_a_gpt2_without_attention_scaling_exports(tmp_path):
  """GPT-2's scale_attn_weights=False (qk_scale=1.0) is a GPT-2 setting: written, and read back."""
  cfg = _ours("gpt2", num_layers=1, qk_scale=1.0)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  back, _ = hf.from_hf(str(tmp_path))
  assert back.qk_scale == 1.0 and hf._arch(back) == hf._arch(cfg)


@pytest.mark.parametrize("family,key", [("gpt2", "layer_norm_epsilon"), ("llama", "rms_norm_eps"),
                                        ("bert", "layer_norm_eps"), ("t5", "layer_norm_epsilon")])
def test_a_config_without_its_norm_epsilon_takes_transformers_default(family, key, tmp_path):
  """A config.json that leaves the epsilon out (older or hand-written configs) means the
  default of the family's transformers config class, which is what transformers computes."""
  T = pytest.importorskip("transformers")
  cfg = _ours(family, num_layers=1)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  path = os.path.join(tmp_path, "config.json")
  with open(path) as f:
    written = json.load(f)
  del written[key]
  with open(path, "w") as f:
    json.dump(written, f)
  back, _ = hf.from_hf(str(tmp_path))
  assert back.norm_eps == getattr(T.AutoConfig.for_model(written["model_type"]), key)
