"""transformer/training/throughput.py: the peak rate MFU divides by."""

import jax

from transformer.training import throughput


def test_peak_flops_is_the_configured_rate_times_the_devices(monkeypatch):
  """train.peak_flops is per device, over every device of the job; without it an accelerator's
  is looked up by its kind."""
  monkeypatch.setattr(jax, "device_count", lambda: 4)
  assert throughput.peak_flops(2e12) == 8e12
  monkeypatch.setitem(throughput.PEAK_FLOPS, jax.devices()[0].device_kind, 5e12)
  assert throughput.peak_flops() == 20e12
  assert throughput.peak_flops(2e12) == 8e12  # the configured rate wins over the table
