"""The tensor rules the Hugging Face families are written in (interop/hf_families.py).

A Rule pairs one Hugging Face tensor with the parameter(s) of ours it holds and the reshape
each way; the helpers below build the common ones (a plain copy, a torch Linear, heads split
in or out of a projection, GPT-2's fused qkv, norms, the attention block).
"""

import dataclasses
from typing import Callable

import numpy as np

from transformer.model import models


@dataclasses.dataclass(frozen=True)
class Rule:
  """One Hugging Face tensor and the parameter(s) of ours it holds."""
  hf: str
  ours: tuple[str, ...]
  to_ours: Callable  # hf array -> tuple of our arrays
  to_hf: Callable  # *our arrays -> hf array


def same(hf, ours):
  return Rule(hf, (ours,), lambda x: (x,), lambda x: x)


def linear(hf, ours):
  """torch Linear weight [out, in] <-> kernel [in, out]."""
  return Rule(hf, (ours,), lambda w: (w.T,), lambda k: k.T)


def heads_in(hf, ours, heads, head_dim, conv=False):
  """Linear [heads*head_dim, D] (Conv1D [D, heads*head_dim]) <-> kernel [D, heads, head_dim]."""
  def to_ours(w):
    w = w if conv else w.T
    return (w.reshape(w.shape[0], heads, head_dim),)
  return Rule(hf, (ours,), to_ours,
              lambda k: k.reshape(k.shape[0], -1) if conv else k.reshape(k.shape[0], -1).T)


def heads_out(hf, ours, heads, head_dim, conv=False):
  """Linear [D, heads*head_dim] (Conv1D [heads*head_dim, D]) <-> kernel [heads, head_dim, D]."""
  def to_ours(w):
    w = w if conv else w.T
    return (w.reshape(heads, head_dim, w.shape[-1]),)
  return Rule(hf, (ours,), to_ours,
              lambda k: k.reshape(-1, k.shape[-1]) if conv else k.reshape(-1, k.shape[-1]).T)


def heads_bias(hf, ours, heads, head_dim):
  """[heads*head_dim] <-> [heads, head_dim]."""
  return Rule(hf, (ours,), lambda b: (b.reshape(heads, head_dim),), lambda b: b.reshape(-1))


def fused_qkv(hf, ours, heads, head_dim):
  """GPT-2's c_attn: q, k and v side by side on the last axis (Conv1D weight or bias)."""
  def to_ours(x):
    if x.shape[-1] != 3 * heads * head_dim:
      raise ValueError("not q, k and v")
    return tuple(p.reshape(*p.shape[:-1], heads, head_dim) for p in np.split(x, 3, axis=-1))
  return Rule(hf, tuple(ours), to_ours,
              lambda *ks: np.concatenate([k.reshape(*k.shape[:-2], -1) for k in ks], axis=-1))


def norm(hf, ours, bias=True):
  rules = [same(f"{hf}.weight", f"{ours}/norm/scale")]
  return rules + [same(f"{hf}.bias", f"{ours}/norm/bias")] if bias else rules


def dense(hf, ours, bias=True):
  rules = [linear(f"{hf}.weight", f"{ours}/kernel")]
  return rules + [same(f"{hf}.bias", f"{ours}/bias")] if bias else rules


def attention(ours, cfg, q, k, v, o):
  """Separate q/k/v/o Linears (Llama, BERT, T5), named without ".weight", optional biases."""
  n, kv, h = cfg.num_heads, models.num_kv_heads(cfg), models.head_dim(cfg)
  rules = [heads_in(f"{q}.weight", f"{ours}/query/kernel", n, h),
           heads_in(f"{k}.weight", f"{ours}/key/kernel", kv, h),
           heads_in(f"{v}.weight", f"{ours}/value/kernel", kv, h),
           heads_out(f"{o}.weight", f"{ours}/out/kernel", n, h)]
  if cfg.use_bias:
    rules += [heads_bias(f"{q}.bias", f"{ours}/query/bias", n, h),
              heads_bias(f"{k}.bias", f"{ours}/key/bias", kv, h),
              heads_bias(f"{v}.bias", f"{ours}/value/bias", kv, h),
              same(f"{o}.bias", f"{ours}/out/bias")]
  return rules


def is_tied(hf: dict, names, same_tensor, head: str, embed: str) -> bool:
  """Whether the output projection is the token table. transformers ties when the config asks,
  but loads a head tensor that differs from the table as a separate head, and so do we."""
  if head in names:
    return same_tensor(head, embed)
  return bool(hf.get("tie_word_embeddings", True))


# ---------------------------------------------------------------------------------------------
# Families. config(hf, names, same_tensor) -> model config; hf_config(cfg) -> dict; rules(cfg).
