"""The stand-in sweep config of the launcher tests (launch_test.py, launch_runs_test.py)."""

import ml_collections

from launch import sweep


def sweep_config(**sweep_settings):
  """A stand-in for configs/lm.py: the keys the sweep reads, without the data pipeline."""
  config = ml_collections.ConfigDict(dict(
      model=dict(kind="decoder", vocab_size=260, ffn="gelu", tie_embeddings=True, d_model=64,
                 num_layers=2, num_heads=2, num_kv_heads=0, head_dim=0, d_ff=256, window=0),
      data=dict(seq_len=128), train=dict(steps=100, batch_size=16, log_every=25,
                                         eval_every=50, checkpoint_every=50),
      opt=dict(lr=1e-3, warmup_steps=50, weight_decay=0.1), sweep=sweep.default_config()))
  config.sweep.update(sweep_settings)
  return config
