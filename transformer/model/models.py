"""Decoder (GPT/Llama), Encoder (BERT) and EncoderDecoder (2017 Transformer / T5).

    tokens_BL -> embed (+ positions) -> Stack of Blocks -> final norm -> logits_BLV

`make_model(model_config)` validates the config and returns the Linen module. Inputs follow
one convention everywhere: segment_ids 0 is padding, 1, 2, ... are documents packed into a
row (they never see each other); positions restart at 0 in each document; both default to a
single unpadded document.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from transformer.cpu import projection
from transformer.model.attention import IMPLEMENTATIONS, make_layout
from transformer.model.dense import Dense
from transformer.model.layers import FFNS, NORMS, REMAT_POLICIES, Norm, Stack
from transformer.model.positions import SCHEMES, make_scheme

KINDS = ("decoder", "encoder", "encoder_decoder")


def head_dim(cfg) -> int:
  return cfg.head_dim or cfg.d_model // cfg.num_heads


def num_kv_heads(cfg) -> int:
  return cfg.num_kv_heads or cfg.num_heads


class Embedder(nn.Module):
  """Token table shared by the input side and (when tied) the output projection."""
  cfg: ml_collections.ConfigDict

  def setup(self):
    cfg = self.cfg
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
        (cfg.vocab_size, cfg.d_model), jnp.dtype(cfg.param_dtype))
    if cfg.num_token_types:
      self.token_types = self.param(
          "token_type_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
          (cfg.num_token_types, cfg.d_model), jnp.dtype(cfg.param_dtype))

  def __call__(self, tokens_BL, token_types_BL=None):
    x_BLD = jnp.take(self.embedding, tokens_BL, axis=0).astype(jnp.dtype(self.cfg.dtype))
    if self.cfg.scale_embeddings:
      x_BLD = x_BLD * jnp.sqrt(jnp.asarray(self.cfg.d_model, x_BLD.dtype))
    if self.cfg.num_token_types:
      types = jnp.zeros_like(tokens_BL) if token_types_BL is None else token_types_BL
      x_BLD = x_BLD + jnp.take(self.token_types, types, axis=0).astype(x_BLD.dtype)
    return x_BLD

  def attend(self, x_BLD):
    B, L, D = x_BLD.shape
    logits_TV = projection.dot_general(x_BLD.reshape(B * L, D),
                                       self.embedding.astype(x_BLD.dtype),
                                       (((1,), (1,)), ((), ())))
    return logits_TV.reshape(B, L, -1)


class Head(nn.Module):
  """Final norm (pre-norm stacks only: a post-norm block already ends normalized) and the
  vocabulary projection, tied to the embedding or separate."""
  cfg: ml_collections.ConfigDict

  @nn.compact
  def __call__(self, x_BLD, embedder: Embedder):
    cfg = self.cfg
    if cfg.mlm_transform:  # BERT's MLM head: dense, activation, norm before the projection
      x_BLD = Dense(cfg.d_model, ("embed", "embed_out"), bias_axes=("embed",), use_bias=True,
                    cfg=cfg, name="transform")(x_BLD)
      x_BLD = Norm(cfg, name="transform_norm")(FFNS[cfg.ffn][0](x_BLD))
    if cfg.tie_embeddings:
      if cfg.scale_tied_logits:
        x_BLD = x_BLD * cfg.d_model ** -0.5
      logits = embedder.attend(x_BLD)
    else:
      logits = Dense(cfg.vocab_size, ("embed", "vocab"), use_bias=False, cfg=cfg,
                     name="logits")(x_BLD)
    if cfg.head_bias:
      logits = logits + self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
          (cfg.vocab_size,), jnp.dtype(cfg.param_dtype))
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32)


class Tower(nn.Module):
  """One side of a model: positions, embedding-side extras, the block stack, a final norm."""
  cfg: ml_collections.ConfigDict
  num_layers: int
  causal: bool
  cross: bool = False

  @nn.compact
  def __call__(self, x_BLD, segment_ids, positions, deterministic, prefix=None,
               enc_BSD=None, enc_segment_ids=None, layout=None, cache_mode=""):
    """`layout` (decoding only) replaces segment_ids/positions: at a cached step its keys
    are the cache slots, not the inputs (see decode.py)."""
    cfg = self.cfg
    B, L = x_BLD.shape[:2]
    scheme = make_scheme(cfg, name="positions")
    if layout is None:
      layout = make_layout(L, L, batch=B, q_segments=segment_ids, k_segments=segment_ids,
                           q_positions=positions, k_positions=positions, prefix=prefix,
                           causal=self.causal, window=cfg.window)
    x_BLD = scheme.embed(x_BLD, layout.q_pos_BL)
    # A zero we can differentiate against: d(logits)/d(embedded) tests causality and probes.
    x_BLD = self.perturb("embedded", x_BLD)
    if cfg.embed_norm:
      x_BLD = Norm(cfg, name="embed_norm")(x_BLD)
    x_BLD = nn.Dropout(cfg.dropout_rate)(x_BLD, deterministic=deterministic)
    x_BLD = nn.with_logical_constraint(x_BLD, ("batch", "length", "embed"))
    cross_layout = None
    if self.cross:
      S = enc_BSD.shape[1]
      # Queries of decoder document i see keys of encoder document i (segment equality).
      cross_layout = make_layout(L, S, batch=B, q_segments=layout.q_seg_BL,
                                 k_segments=enc_segment_ids)
    x_BLD = Stack(cfg, self.num_layers, self.cross, deterministic, cache_mode, name="stack")(
        x_BLD, layout, scheme.attention_terms(self.causal), enc_BSD, cross_layout)
    if cfg.norm_position == "pre":
      x_BLD = Norm(cfg, name="final_norm")(x_BLD)
    return x_BLD


class Decoder(nn.Module):
  """Causal LM. `prefix_BL` (bool) marks a prefix that attends bidirectionally (prefix-LM)."""
  cfg: ml_collections.ConfigDict

  def setup(self):
    self.embedder = Embedder(self.cfg)
    self.tower = Tower(self.cfg, self.cfg.num_layers, causal=True)
    self.head = Head(self.cfg)

  def __call__(self, inputs_BL, segment_ids=None, positions=None, prefix_BL=None,
               deterministic=True):
    x_BLD = self.embedder(inputs_BL)
    x_BLD = self.tower(x_BLD, segment_ids, positions, deterministic, prefix=prefix_BL)
    return self.head(x_BLD, self.embedder)

  def extend(self, tokens_BL, layout, cache_mode):
    """Decoding: run tokens against the KV cache (the mutable 'cache' collection), the
    prompt at cache_mode='prefill', one new token per row at 'step'."""
    x_BLD = self.tower(self.embedder(tokens_BL), None, None, True, layout=layout,
                       cache_mode=cache_mode)
    return self.head(x_BLD, self.embedder)


class Encoder(nn.Module):
  """Bidirectional encoder with a masked-LM head; the pooled first-token output (BERT's
  pooler) is sown as intermediates/pooled when model.pooler is set."""
  cfg: ml_collections.ConfigDict

  def setup(self):
    self.embedder = Embedder(self.cfg)
    self.tower = Tower(self.cfg, self.cfg.num_layers, causal=False)
    self.head = Head(self.cfg)
    if self.cfg.pooler:
      self.pooler = nn.Dense(
          self.cfg.d_model, dtype=jnp.dtype(self.cfg.dtype),
          param_dtype=jnp.dtype(self.cfg.param_dtype),
          kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                   ("embed", "embed_out")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))

  def encode(self, inputs_BL, segment_ids=None, positions=None, token_types=None,
             deterministic=True):
    x_BLD = self.embedder(inputs_BL, token_types)
    return self.tower(x_BLD, segment_ids, positions, deterministic)

  def __call__(self, inputs_BL, segment_ids=None, positions=None, token_types=None,
               deterministic=True):
    x_BLD = self.encode(inputs_BL, segment_ids, positions, token_types, deterministic)
    if self.cfg.pooler:
      self.sow("intermediates", "pooled", jnp.tanh(self.pooler(x_BLD[:, 0])))
    return self.head(x_BLD, self.embedder)


class EncoderDecoder(nn.Module):
  """The 2017 arrangement: a bidirectional encoder and a causal decoder whose
  cross-attention takes queries from the decoder and keys/values from the encoder output.
  One token table serves both sides (and the output, when tied), as in Vaswani et al. and T5."""
  cfg: ml_collections.ConfigDict

  def setup(self):
    cfg = self.cfg
    self.embedder = Embedder(cfg)
    self.encoder = Tower(cfg, cfg.num_encoder_layers or cfg.num_layers, causal=False)
    self.decoder = Tower(cfg, cfg.num_decoder_layers or cfg.num_layers, causal=True, cross=True)
    self.head = Head(cfg)

  def encode(self, encoder_inputs, encoder_segment_ids=None, encoder_positions=None,
             deterministic=True):
    return self.encoder(self.embedder(encoder_inputs), encoder_segment_ids, encoder_positions,
                        deterministic)

  def decode(self, encoded_BSD, decoder_inputs, encoder_segment_ids=None,
             decoder_segment_ids=None, decoder_positions=None, deterministic=True):
    if encoder_segment_ids is None:
      encoder_segment_ids = jnp.ones(encoded_BSD.shape[:2], jnp.int32)
    if decoder_segment_ids is None:
      decoder_segment_ids = jnp.ones(decoder_inputs.shape, jnp.int32)
    x_BLD = self.decoder(self.embedder(decoder_inputs), decoder_segment_ids, decoder_positions,
                         deterministic, enc_BSD=encoded_BSD, enc_segment_ids=encoder_segment_ids)
    return self.head(x_BLD, self.embedder)

  def extend(self, encoded_BSD, encoder_segment_ids, tokens_BL, layout, cache_mode):
    """Decoding (see Decoder.extend). Cross-attention keys/values are computed from
    encoded_BSD at prefill only; later steps read them from the cache."""
    x_BLD = self.decoder(self.embedder(tokens_BL), None, None, True, enc_BSD=encoded_BSD,
                         enc_segment_ids=encoder_segment_ids, layout=layout,
                         cache_mode=cache_mode)
    return self.head(x_BLD, self.embedder)

  def __call__(self, encoder_inputs, decoder_inputs, encoder_segment_ids=None,
               decoder_segment_ids=None, encoder_positions=None, decoder_positions=None,
               deterministic=True):
    encoded = self.encode(encoder_inputs, encoder_segment_ids, encoder_positions, deterministic)
    return self.decode(encoded, decoder_inputs, encoder_segment_ids, decoder_segment_ids,
                       decoder_positions, deterministic)


MODELS = {"decoder": Decoder, "encoder": Encoder, "encoder_decoder": EncoderDecoder}
# The float dtypes model.dtype, param_dtype and cache_dtype may name ("" = dtype, for the last).
DTYPES = ("float32", "bfloat16", "float16")


def _choice(value, valid, key):
  if value not in valid:
    raise ValueError(f"Unknown model.{key} {value!r}; valid: {sorted(valid)}.")


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Every config error we can find before any compute, each a one-line ValueError."""
  _choice(cfg.kind, MODELS, "kind")
  _choice(cfg.position.name, SCHEMES, "position.name")
  _choice(cfg.attention, IMPLEMENTATIONS, "attention")
  _choice(cfg.ffn, FFNS, "ffn")
  _choice(cfg.norm, NORMS, "norm")
  _choice(cfg.norm_position, ("pre", "post"), "norm_position")
  _choice(cfg.remat, REMAT_POLICIES, "remat")
  for key in ("dtype", "param_dtype"):
    _choice(cfg[key], DTYPES, key)
  _choice(cfg.get("cache_dtype", ""), ("",) + DTYPES, "cache_dtype")
  for key in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
    if cfg[key] < 1:
      raise ValueError(f"model.{key} must be positive, got {cfg[key]}.")
  for key in ("num_kv_heads", "head_dim", "num_token_types", "num_encoder_layers",
              "num_decoder_layers", "qk_scale", "norm_eps"):
    if cfg[key] < 0:
      raise ValueError(f"model.{key} must be >= 0 (0 = the default), got {cfg[key]}.")
  if cfg.attention_chunk < 1:
    raise ValueError(f"model.attention_chunk must be positive, got {cfg.attention_chunk}.")
  for key in ("dropout_rate", "attention_dropout_rate"):
    if not 0 <= cfg[key] < 1:
      raise ValueError(f"model.{key} must be in [0, 1), got {cfg[key]}.")
  _validate_position(cfg.position)
  if not cfg.head_dim and cfg.d_model % cfg.num_heads:
    raise ValueError(f"model.d_model={cfg.d_model} is not divisible by model.num_heads="
                     f"{cfg.num_heads}; change one or set model.head_dim explicitly.")
  if cfg.num_heads % num_kv_heads(cfg):
    raise ValueError(f"model.num_heads={cfg.num_heads} is not a multiple of model.num_kv_heads="
                     f"{cfg.num_kv_heads}; use a divisor (1 = MQA, num_heads = MHA).")
  if cfg.position.name == "rope" and head_dim(cfg) % 2:
    raise ValueError(f"rope needs an even head_dim, got {head_dim(cfg)}.")
  if cfg.position.name == "sinusoidal" and cfg.d_model % 2:
    raise ValueError(f"sinusoidal positions need an even d_model, got {cfg.d_model}.")
  if cfg.window < 0:
    raise ValueError(f"model.window must be >= 0 (0 = unlimited), got {cfg.window}.")
  if cfg.scale_tied_logits and not cfg.tie_embeddings:
    raise ValueError("model.scale_tied_logits needs model.tie_embeddings=True.")


def _validate_position(p: ml_collections.ConfigDict) -> None:
  """The ranges each scheme's formula needs; outside them it trains on NaNs or nothing."""
  if p.name == "rope":
    if not 0 < p.rotary_fraction <= 1:
      raise ValueError(f"model.position.rotary_fraction must be in (0, 1], got "
                       f"{p.rotary_fraction}.")
    if p.theta <= 0:
      raise ValueError(f"model.position.theta must be positive, got {p.theta}.")
    if p.scaling != "none" and p.scaling_factor < 1:
      raise ValueError(f"model.position.scaling={p.scaling!r} extends the context by "
                       f"scaling_factor >= 1, got {p.scaling_factor}.")
    if p.scaling == "llama3" and not 0 < p.low_freq_factor < p.high_freq_factor:
      raise ValueError(f"llama3 scaling needs 0 < model.position.low_freq_factor < "
                       f"high_freq_factor, got {p.low_freq_factor} and {p.high_freq_factor}.")
  if p.name == "sinusoidal" and p.max_wavelength <= 0:
    raise ValueError(f"model.position.max_wavelength must be positive, got "
                     f"{p.max_wavelength}.")
  if p.name == "t5_bias" and not (p.num_buckets >= 4 and p.max_distance > p.num_buckets // 2):
    # Half the buckets (a quarter, bidirectional) are exact offsets; the log-spaced rest
    # need max_distance beyond them.
    raise ValueError(f"t5_bias needs model.position.num_buckets >= 4 and max_distance > "
                     f"num_buckets // 2, got {p.num_buckets} and {p.max_distance}.")


def make_model(cfg: ml_collections.ConfigDict) -> nn.Module:
  """The Linen module for a model config (validated first)."""
  validate(cfg)
  return MODELS[cfg.kind](cfg)


def dummy_inputs(cfg: ml_collections.ConfigDict, batch: int = 1, length: int = 8):
  """Positional args for `init` / `eval_shape` of any kind."""
  tokens = jnp.zeros((batch, length), jnp.int32)
  return (tokens, tokens) if cfg.kind == "encoder_decoder" else (tokens,)


def init_params(cfg: ml_collections.ConfigDict, rng: jax.Array, length: int = 8):
  return make_model(cfg).init(rng, *dummy_inputs(cfg, length=length))
