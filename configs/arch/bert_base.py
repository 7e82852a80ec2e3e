"""BERT base (Devlin et al. 2019; `bert-base-uncased` with its masked-LM head).

Post-norm blocks, learned positions, segment (token-type) embeddings, a norm on the
embeddings, and the MLM head's dense+GELU+norm transform with a tied, biased projection.
The NSP pooler is off (BertForMaskedLM has none); set model.pooler=True for pooled outputs.

  python -m transformer.inspect --config configs/arch/bert_base.py
"""

import ml_collections

from transformer.schema import model_config, position_config


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(dict(model=model_config(
      kind="encoder", vocab_size=30_522, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
      ffn="gelu", norm="layernorm", norm_eps=1e-12, norm_position="post", use_bias=True,
      tie_embeddings=True, max_len=512, position=position_config("learned"), embed_norm=True,
      num_token_types=2, mlm_transform=True, head_bias=True, pooler=False, dropout_rate=0.1,
      attention_dropout_rate=0.1)))
