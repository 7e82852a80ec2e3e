"""experiments/benchmarks/products.py: the step's products it times, and its two timers."""

import pytest

pytest.importorskip("torch")

from experiments.benchmarks import products, train_throughput  # noqa: E402 (needs torch)
from transformer.analysis import model_stats  # noqa: E402


@pytest.mark.parametrize("name", sorted(train_throughput.WORKLOADS))
def test_the_products_are_every_projection_of_the_model_three_times(name):
  """Forward, input and weight gradient of each matrix the model holds (the blocks' and the
  tied head's): 6 x T x those parameters, the FLOPs the benchmark sums."""
  model, w = train_throughput.workload_model(name), train_throughput.WORKLOADS[name]
  block = model_stats.count_params(model)["per_block"]["tower"]
  T = w["batch_size"] * w["seq_len"]
  matrices = block["num_layers"] * (block["attention"] + block["ffn"]) + 256 * model.d_model
  assert sum(3 * 2 * I * O * t * n for _, I, O, t, n in products.products(name)) == 6 * T * matrices


def test_both_timers_time_every_kind_of_product():
  for timer in (products.xla_times, products.torch_times):
    times = timer(32, 48, 64, repeats=2)
    assert set(times) == {"forward", "input", "weight"}
    assert all(0 < t < 1 for t in times.values()), times
