"""How each Hugging Face architecture configures, names and lays out what our modules hold.

A family (GPT-2, Llama, BERT, T5) is two config translations and a list of tensor rules:
  config(hf, names, same_tensor) -> model config    (names: the checkpoint's tensor names)
  hf_config(model_config) -> the family's config.json keys
  rules(model_config) -> [Rule]: one HF tensor <-> one or more of our parameters ("a/b/c"
                         paths, layers unrolled), with the reshape between the layouts
Layouts differ only by transposes and reshapes (torch Linear [out, in], GPT-2's Conv1D
[in, out], our DenseGeneral kernels [D, heads, head_dim]), so both directions are exact.
transformer.convert does the reading, writing and checking; the rules are in hf_rules.py.
"""

from transformer.schema import model_config, position_config
from transformer.model import models
from transformer.interop.hf_rules import (attention, dense, fused_qkv, heads_out, is_tied, linear,
                                          norm, same)

# (HF activation, gated) -> model.ffn. For export, the first name listed for an ffn is written.
ACTIVATIONS = {("gelu_new", False): "gelu_tanh", ("gelu_pytorch_tanh", False): "gelu_tanh",
               ("gelu", False): "gelu", ("relu", False): "relu", ("silu", True): "swiglu",
               ("swish", True): "swiglu", ("gelu_pytorch_tanh", True): "geglu",
               ("gelu_new", True): "geglu"}
# HF rope_type -> model.position.scaling. "dynamic" and "longrope" change the frequencies with
# the input length, which a fixed table cannot do.
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}


def _ffn(act: str, gated: bool, family: str) -> str:
  if (act, gated) not in ACTIVATIONS:
    valid = sorted(a for a, g in ACTIVATIONS if g == gated)
    raise ValueError(f"{family}: activation {act!r} has no model.ffn equivalent here; "
                     f"convertible: {valid}")
  return ACTIVATIONS[(act, gated)]


def _act_name(ffn: str, gated: bool, family: str) -> str:
  for (act, g), ours in ACTIVATIONS.items():
    if ours == ffn and g == gated:
      return act
  kind = "gated" if gated else "plain"
  raise ValueError(f"{family} uses a {kind} feed-forward; model.ffn={ffn!r} is not one "
                   f"(valid: {sorted({o for (_, g), o in ACTIVATIONS.items() if g == gated})})")


class GPT2:
  model_type, architecture = "gpt2", "GPT2LMHeadModel"
  prefix, heads = "transformer.", ("lm_head.",)
  duplicates = {"lm_head.weight": "transformer.wte.weight"}
  ignored = (r"\.attn\.(masked_)?bias$",)  # causal-mask buffers of old checkpoints

  def config(self, hf, names, same_tensor):
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
      if hf.get(key):
        raise ValueError(f"gpt2: {key}=True is not supported")
    d = hf["n_embd"]
    return model_config(
        kind="decoder", vocab_size=hf["vocab_size"], d_model=d, num_layers=hf["n_layer"],
        num_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * d,
        ffn=_ffn(hf.get("activation_function", "gelu_new"), False, "gpt2"), norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), use_bias=True,
        qk_scale=0.0 if hf.get("scale_attn_weights", True) else 1.0,
        position=position_config("learned"), max_len=hf.get("n_positions", 1024),
        tie_embeddings=is_tied(hf, names, same_tensor, "lm_head.weight", "transformer.wte.weight"),
        dropout_rate=hf.get("resid_pdrop", 0.1), attention_dropout_rate=hf.get("attn_pdrop", 0.1))

  def hf_config(self, cfg):
    return dict(vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_layer=cfg.num_layers,
                n_head=cfg.num_heads, n_inner=cfg.d_ff, n_positions=cfg.max_len,
                activation_function=_act_name(cfg.ffn, False, "gpt2"),
                layer_norm_epsilon=cfg.norm_eps, scale_attn_weights=cfg.qk_scale == 0.0,
                tie_word_embeddings=cfg.tie_embeddings, resid_pdrop=cfg.dropout_rate,
                embd_pdrop=cfg.dropout_rate, attn_pdrop=cfg.attention_dropout_rate)

  def rules(self, cfg):
    n, h = cfg.num_heads, models.head_dim(cfg)
    rules = [same("transformer.wte.weight", "embedder/embedding"),
             same("transformer.wpe.weight", "tower/positions/pos_embedding"),
             *norm("transformer.ln_f", "tower/final_norm")]
    for i in range(cfg.num_layers):
      p, o = f"transformer.h.{i}", f"tower/stack/layers_{i}"
      qkv = [f"{o}/self_attention/{x}" for x in ("query", "key", "value")]
      rules += [*norm(f"{p}.ln_1", f"{o}/self_attention_norm"),
                fused_qkv(f"{p}.attn.c_attn.weight", [f"{x}/kernel" for x in qkv], n, h),
                fused_qkv(f"{p}.attn.c_attn.bias", [f"{x}/bias" for x in qkv], n, h),
                heads_out(f"{p}.attn.c_proj.weight", f"{o}/self_attention/out/kernel", n, h,
                          conv=True),
                same(f"{p}.attn.c_proj.bias", f"{o}/self_attention/out/bias"),
                *norm(f"{p}.ln_2", f"{o}/ffn_norm"),
                same(f"{p}.mlp.c_fc.weight", f"{o}/ffn/wi/kernel"),
                same(f"{p}.mlp.c_fc.bias", f"{o}/ffn/wi/bias"),
                same(f"{p}.mlp.c_proj.weight", f"{o}/ffn/wo/kernel"),
                same(f"{p}.mlp.c_proj.bias", f"{o}/ffn/wo/bias")]
    if not cfg.tie_embeddings:
      rules.append(linear("lm_head.weight", "head/logits/kernel"))
    return rules


class Llama:
  model_type, architecture = "llama", "LlamaForCausalLM"
  prefix, heads = "model.", ("lm_head.",)
  duplicates = {"lm_head.weight": "model.embed_tokens.weight"}
  ignored = (r"rotary_emb\.inv_freq$",)

  def config(self, hf, names, same_tensor):
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
      raise ValueError("llama: attention_bias and mlp_bias differ; model.use_bias sets both")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    k, h = hf.get("num_key_value_heads") or n, hf.get("head_dim") or d // n
    return model_config(
        kind="decoder", vocab_size=hf["vocab_size"], d_model=d,
        num_layers=hf["num_hidden_layers"], num_heads=n, num_kv_heads=0 if k == n else k,
        head_dim=0 if h == d // n else h, d_ff=hf["intermediate_size"],
        ffn=_ffn(hf.get("hidden_act", "silu"), True, "llama"), norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), use_bias=bool(hf.get("attention_bias", False)),
        position=self._rope(hf), max_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=is_tied(hf, names, same_tensor, "lm_head.weight",
                             "model.embed_tokens.weight"),
        dropout_rate=0.0, attention_dropout_rate=hf.get("attention_dropout", 0.0))

  @staticmethod
  def _rope(hf):
    # transformers 5 keeps everything in rope_parameters; 4.x used rope_theta + rope_scaling.
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
      raise ValueError(f"llama: rope type {kind!r} has no equivalent here; convertible: "
                       f"{sorted(ROPE_TYPES)}")
    pos = position_config("rope", theta=float(params.get("rope_theta",
                                                         hf.get("rope_theta", 10_000.0))),
                          scaling=ROPE_TYPES[kind])
    if kind == "default":
      return pos
    pos.scaling_factor = float(params["factor"])
    if kind in ("llama3", "yarn"):
      pos.original_max_len = int(params.get("original_max_position_embeddings") or
                                 hf["max_position_embeddings"])
    if kind == "llama3":
      pos.low_freq_factor = float(params["low_freq_factor"])
      pos.high_freq_factor = float(params["high_freq_factor"])
    if kind == "yarn":
      # Ours is the paper's YaRN: cos/sin scaled by 0.1 ln(factor) + 1, truncated ramp.
      if (params.get("attention_factor") is not None or params.get("mscale")
          or params.get("mscale_all_dim") or params.get("truncate", True) is False
          or pos.scaling_factor <= 1):
        raise ValueError("llama: yarn with attention_factor, mscale, truncate=False or "
                         "factor <= 1 is not supported")
      pos.beta_fast = float(params.get("beta_fast") or 32)
      pos.beta_slow = float(params.get("beta_slow") or 1)
    return pos

  def hf_config(self, cfg):
    pos = cfg.position
    rope_type = {v: k for k, v in ROPE_TYPES.items()}.get(pos.scaling)
    if rope_type is None:
      raise ValueError(f"llama: model.position.scaling={pos.scaling!r} has no Hugging Face "
                       f"rope type; valid: {sorted(ROPE_TYPES.values())}")
    rope = {"rope_type": rope_type, "rope_theta": pos.theta}
    if rope_type != "default":
      rope["factor"] = pos.scaling_factor
    if rope_type in ("llama3", "yarn"):
      rope["original_max_position_embeddings"] = pos.original_max_len or cfg.max_len
    if rope_type == "llama3":
      rope.update(low_freq_factor=pos.low_freq_factor, high_freq_factor=pos.high_freq_factor)
    if rope_type == "yarn":
      rope.update(beta_fast=pos.beta_fast, beta_slow=pos.beta_slow)
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                intermediate_size=cfg.d_ff, num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads, num_key_value_heads=models.num_kv_heads(cfg),
                head_dim=models.head_dim(cfg), hidden_act=_act_name(cfg.ffn, True, "llama"),
                max_position_embeddings=cfg.max_len, rms_norm_eps=cfg.norm_eps,
                attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias,
                tie_word_embeddings=cfg.tie_embeddings,
                attention_dropout=cfg.attention_dropout_rate,
                # transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling.
                rope_parameters=rope, rope_theta=pos.theta,
                rope_scaling=None if rope_type == "default" else
                {k: v for k, v in rope.items() if k != "rope_theta"})

  def rules(self, cfg):
    rules = [same("model.embed_tokens.weight", "embedder/embedding"),
             same("model.norm.weight", "tower/final_norm/norm/scale")]
    for i in range(cfg.num_layers):
      p, o = f"model.layers.{i}", f"tower/stack/layers_{i}"
      rules += [same(f"{p}.input_layernorm.weight", f"{o}/self_attention_norm/norm/scale"),
                *attention(f"{o}/self_attention", cfg,
                           *(f"{p}.self_attn.{x}_proj" for x in "qkvo")),
                same(f"{p}.post_attention_layernorm.weight", f"{o}/ffn_norm/norm/scale"),
                *dense(f"{p}.mlp.gate_proj", f"{o}/ffn/wi_0", cfg.use_bias),
                *dense(f"{p}.mlp.up_proj", f"{o}/ffn/wi_1", cfg.use_bias),
                *dense(f"{p}.mlp.down_proj", f"{o}/ffn/wo", cfg.use_bias)]
    if not cfg.tie_embeddings:
      rules.append(linear("lm_head.weight", "head/logits/kernel"))
    return rules


class Bert:
  """BertForMaskedLM. A pooler is kept when the checkpoint has one; BertForPreTraining's
  next-sentence head is dropped (it does not touch the MLM logits)."""
  model_type, architecture = "bert", "BertForMaskedLM"
  prefix, heads = "bert.", ("cls.",)
  duplicates = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                "cls.predictions.decoder.bias": "cls.predictions.bias"}
  ignored = (r"embeddings\.position_ids$", r"^cls\.seq_relationship\.")

  def config(self, hf, names, same_tensor):
    if hf.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(f"bert: position_embedding_type={hf['position_embedding_type']!r}; "
                       f"only 'absolute' is supported")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
      raise ValueError("bert: decoder BERT (is_decoder / add_cross_attention) is not supported")
    return model_config(
        kind="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], ffn=_ffn(hf.get("hidden_act", "gelu"), False, "bert"),
        norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12), norm_position="post",
        use_bias=True, position=position_config("learned"),
        max_len=hf.get("max_position_embeddings", 512), embed_norm=True,
        num_token_types=hf.get("type_vocab_size", 2), mlm_transform=True, head_bias=True,
        pooler="bert.pooler.dense.weight" in names,
        tie_embeddings=is_tied(hf, names, same_tensor, "cls.predictions.decoder.weight",
                             "bert.embeddings.word_embeddings.weight"),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1))

  def hf_config(self, cfg):
    if cfg.num_token_types < 1:  # else the export fails later, on a missing tensor
      raise ValueError("bert embeds token types; model.num_token_types=0 has no table")
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                intermediate_size=cfg.d_ff, hidden_act=_act_name(cfg.ffn, False, "bert"),
                layer_norm_eps=cfg.norm_eps, max_position_embeddings=cfg.max_len,
                type_vocab_size=cfg.num_token_types, position_embedding_type="absolute",
                tie_word_embeddings=cfg.tie_embeddings, hidden_dropout_prob=cfg.dropout_rate,
                attention_probs_dropout_prob=cfg.attention_dropout_rate)

  def rules(self, cfg):
    e = "bert.embeddings"
    rules = [same(f"{e}.word_embeddings.weight", "embedder/embedding"),
             same(f"{e}.position_embeddings.weight", "tower/positions/pos_embedding"),
             same(f"{e}.token_type_embeddings.weight", "embedder/token_type_embedding"),
             *norm(f"{e}.LayerNorm", "tower/embed_norm"),
             *dense("cls.predictions.transform.dense", "head/transform"),
             *norm("cls.predictions.transform.LayerNorm", "head/transform_norm"),
             same(self._bias(cfg), "head/bias")]
    for i in range(cfg.num_layers):
      p, o = f"bert.encoder.layer.{i}", f"tower/stack/layers_{i}"
      a = f"{p}.attention"
      rules += [*attention(f"{o}/self_attention", cfg, f"{a}.self.query", f"{a}.self.key",
                           f"{a}.self.value", f"{a}.output.dense"),
                *norm(f"{p}.attention.output.LayerNorm", f"{o}/self_attention_norm"),
                *dense(f"{p}.intermediate.dense", f"{o}/ffn/wi"),
                *dense(f"{p}.output.dense", f"{o}/ffn/wo"),
                *norm(f"{p}.output.LayerNorm", f"{o}/ffn_norm")]
    if cfg.pooler:
      rules += dense("bert.pooler.dense", "pooler")
    if not cfg.tie_embeddings:
      rules.append(linear("cls.predictions.decoder.weight", "head/logits/kernel"))
    return rules

  @staticmethod
  def _bias(cfg):
    # transformers ties decoder.bias to predictions.bias only with tied embeddings; an untied
    # head adds decoder.bias, and predictions.bias is then unused (transformers 5).
    return "cls.predictions.bias" if cfg.tie_embeddings else "cls.predictions.decoder.bias"

  def mirrors(self, cfg):
    """{tensor: the rule's tensor it stands beside}: written as a copy on export (transformers
    4 links the two), read when the rule's own is missing, and otherwise not read on import."""
    return {} if cfg.tie_embeddings else {"cls.predictions.bias": self._bias(cfg)}


T5_FEED_FORWARD = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new",
                   "geglu": "gated-gelu", "swiglu": "gated-silu"}


class T5:
  """T5 v1.0 (ReLU, tied head scaled by d_model^-0.5) and v1.1 (gated GELU, separate head)."""
  model_type, architecture = "t5", "T5ForConditionalGeneration"
  prefix, heads = "", ()
  duplicates = {"encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight", "lm_head.weight": "shared.weight"}
  ignored = ()

  def config(self, hf, names, same_tensor):
    proj = hf.get("feed_forward_proj", "relu")
    gated, act = proj.startswith("gated-"), proj.split("-")[-1]
    act = "gelu_new" if proj == "gated-gelu" else act  # as transformers reads "gated-gelu"
    tied = is_tied(hf, names, same_tensor, "lm_head.weight", "shared.weight")
    # transformers 5 records the v1.0 logit scaling separately; 4.x inferred it from tying.
    scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    if scale and not tied:
      raise ValueError("t5: decoder outputs scaled by d_model^-0.5 (v1.0) with a separate "
                       "lm_head.weight is not supported")
    return model_config(
        kind="encoder_decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        num_layers=hf["num_layers"], num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        num_heads=hf["num_heads"], head_dim=hf["d_kv"], d_ff=hf["d_ff"],
        ffn=_ffn(act, gated, "t5"), norm="rmsnorm", norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        use_bias=False, qk_scale=1.0,  # T5 folds 1/sqrt(d_kv) into its initialization
        position=position_config(
            "t5_bias", num_buckets=hf.get("relative_attention_num_buckets", 32),
            max_distance=hf.get("relative_attention_max_distance", 128)),
        max_len=hf.get("n_positions", 512), tie_embeddings=tied, scale_tied_logits=bool(scale),
        dropout_rate=hf.get("dropout_rate", 0.1),
        attention_dropout_rate=hf.get("dropout_rate", 0.1))

  def hf_config(self, cfg):
    if cfg.ffn not in T5_FEED_FORWARD:
      raise ValueError(f"t5: model.ffn={cfg.ffn!r} has no feed_forward_proj; valid: "
                       f"{sorted(T5_FEED_FORWARD)}")
    return dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=models.head_dim(cfg),
                d_ff=cfg.d_ff, num_layers=cfg.num_encoder_layers or cfg.num_layers,
                num_decoder_layers=cfg.num_decoder_layers or cfg.num_layers,
                num_heads=cfg.num_heads, feed_forward_proj=T5_FEED_FORWARD[cfg.ffn],
                relative_attention_num_buckets=cfg.position.num_buckets,
                relative_attention_max_distance=cfg.position.max_distance,
                layer_norm_epsilon=cfg.norm_eps, n_positions=cfg.max_len,
                tie_word_embeddings=cfg.tie_embeddings,
                scale_decoder_outputs=cfg.scale_tied_logits, dropout_rate=cfg.dropout_rate,
                is_encoder_decoder=True, pad_token_id=0, eos_token_id=1,
                decoder_start_token_id=0)

  def rules(self, cfg):
    gated = cfg.ffn in ("geglu", "swiglu")
    rules = [same("shared.weight", "embedder/embedding")]
    for side, layers, cross in (("encoder", cfg.num_encoder_layers or cfg.num_layers, False),
                                ("decoder", cfg.num_decoder_layers or cfg.num_layers, True)):
      rules += [same(f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                     f"{side}/positions/rel_bias"),
                same(f"{side}.final_layer_norm.weight", f"{side}/final_norm/norm/scale")]
      for i in range(layers):
        p, o = f"{side}.block.{i}.layer", f"{side}/stack/layers_{i}"
        sub = [("SelfAttention", "self_attention")]
        sub += [("EncDecAttention", "cross_attention")] if cross else []
        for j, (hf_name, ours) in enumerate(sub):
          rules += [*attention(f"{o}/{ours}", cfg, *(f"{p}.{j}.{hf_name}.{x}" for x in "qkvo")),
                    same(f"{p}.{j}.layer_norm.weight", f"{o}/{ours}_norm/norm/scale")]
        f = f"{p}.{len(sub)}"
        wi = ["wi_0", "wi_1"] if gated else ["wi"]
        rules += [*(linear(f"{f}.DenseReluDense.{w}.weight", f"{o}/ffn/{w}/kernel") for w in wi),
                  linear(f"{f}.DenseReluDense.wo.weight", f"{o}/ffn/wo/kernel"),
                  same(f"{f}.layer_norm.weight", f"{o}/ffn_norm/norm/scale")]
    if not cfg.tie_embeddings:
      rules.append(linear("lm_head.weight", "head/logits/kernel"))
    return rules


FAMILIES = {f.model_type: f for f in (GPT2(), Llama(), Bert(), T5())}
# Which family writes a model of ours, by (kind, position scheme).
FAMILY_OF = {("decoder", "learned"): "gpt2", ("decoder", "rope"): "llama",
             ("encoder", "learned"): "bert", ("encoder_decoder", "t5_bias"): "t5"}


def family_of(cfg):
  key = (cfg.kind, cfg.position.name)
  if key not in FAMILY_OF:
    raise ValueError(f"no Hugging Face family writes a model.kind={cfg.kind!r} with "
                     f"position.name={cfg.position.name!r}; convertible (kind, position): "
                     f"{sorted(FAMILY_OF)}")
  return FAMILIES[FAMILY_OF[key]]
