"""Shared defaults for every experiment config: the model config schema, size presets, arg parsing.

A config file is the record of an experiment. Each family file (lm.py, mlm.py, seq2seq.py, ...)
builds on `model_config()` here, so every model key has exactly one default and one meaning.
Values are numbers and strings only (ml_collections can then override any of them from the
command line); "none"/0 stand for "off" instead of None.
"""

import ml_collections


def position_config(name: str = "rope", **overrides) -> ml_collections.ConfigDict:
  """Positional scheme: `name` picks the scheme, the other keys are its parameters.

  Every scheme reads only the keys it needs, so switching schemes on the command line
  (`--config.model.position.name=alibi`) needs no other edits.
  """
  cfg = ml_collections.ConfigDict(dict(
      name=name,
      # rope
      theta=10_000.0,
      rotary_fraction=1.0,  # partial rotary: the share of head_dim that is rotated (GPT-NeoX 0.25)
      scaling="none",  # none | linear | ntk | yarn | llama3 (context extension)
      scaling_factor=1.0,
      original_max_len=0,  # training length the scaling extends from (0: model.max_len)
      low_freq_factor=1.0,  # llama3
      high_freq_factor=4.0,  # llama3
      beta_fast=32.0,  # yarn
      beta_slow=1.0,  # yarn
      # t5_bias
      num_buckets=32,
      max_distance=128,
      # sinusoidal
      max_wavelength=10_000.0,
  ))
  cfg.update(overrides)
  return cfg


def model_config(**overrides) -> ml_collections.ConfigDict:
  """The model schema. Every module reads its settings from here and nothing else."""
  cfg = ml_collections.ConfigDict(dict(
      kind="decoder",  # decoder | encoder | encoder_decoder
      vocab_size=260,
      d_model=256,
      num_layers=4,  # decoder / encoder depth
      num_encoder_layers=0,  # encoder_decoder only; 0 means num_layers
      num_decoder_layers=0,  # encoder_decoder only; 0 means num_layers
      num_heads=4,
      num_kv_heads=0,  # 0 means num_heads (MHA); a divisor gives GQA; 1 is MQA
      head_dim=0,  # 0 means d_model // num_heads
      d_ff=1024,
      ffn="gelu",  # relu | gelu | gelu_tanh | swiglu | geglu
      norm="rmsnorm",  # rmsnorm | layernorm
      norm_eps=1e-6,
      norm_position="pre",  # pre | post (post is the original 2017 block)
      use_bias=False,
      position=position_config("rope"),
      attention="auto",  # dense | chunked | cudnn | linear | block_sparse | auto
      attention_chunk=512,  # query/key block size for chunked and block_sparse
      window=0,  # sliding-window size; 0 means unlimited
      qk_scale=0.0,  # multiplies q.k; 0 means 1/sqrt(head_dim) (T5 folds it into init: 1.0)
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      tie_embeddings=True,
      scale_embeddings=False,  # multiply token embeddings by sqrt(d_model) (Vaswani et al.)
      scale_tied_logits=False,  # multiply the final state by d_model**-0.5 before a tied head (T5)
      embed_norm=False,  # a norm right after the embeddings (BERT)
      num_token_types=0,  # segment-A/B embeddings (BERT uses 2)
      pooler=False,  # encoder: a tanh-dense pooled output of the first token (BERT)
      mlm_transform=False,  # encoder: dense+act+norm before the MLM head (BERT)
      head_bias=False,  # a bias on the output vocabulary projection (BERT)
      dtype="float32",  # compute dtype; softmax and norms always run in float32
      param_dtype="float32",
      max_len=2048,
      scan_layers=False,
      remat="none",  # none | full | dots (save matmul outputs, recompute the rest)
  ))
  cfg.update(overrides)
  return cfg
