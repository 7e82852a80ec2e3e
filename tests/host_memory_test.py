"""Retaining freed host memory: repeated XLA:CPU calls stop page-faulting, and only then."""

import json
import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

# Faults per call of a jitted function with a 64 MiB output: over glibc's largest mmap
# threshold (32 MiB), so by default it is mapped and unmapped on every call.
# Retained, calls run synchronously, as the train command's large steps do
# (transformer/training/host.py): dispatched asynchronously, a call's output could be
# allocated before the one before it was freed, and in 3 of 6 runs (2 of 5 of this test)
# it then faulted ~4,096 pages per call into the heap's new end.
SCRIPT = """
import resource, sys
from transformer.cpu import host_memory
import jax, jax.numpy as jnp
if sys.argv[1] == "retain":
  assert host_memory.retain_freed_memory()
  jax.config.update("jax_cpu_enable_async_dispatch", False)
f = jax.jit(lambda a: jnp.tanh(a) * 2)
a = jnp.ones((4096, 4096))
for _ in range(20):
  f(a).block_until_ready()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
  f(a).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 20)
"""


def faults_per_call(mode):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, check=True,
                       capture_output=True, text=True).stdout
  return float(out.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt only")
def test_retained_memory_is_reused_instead_of_faulted_back_in():
  default, retained = faults_per_call("default"), faults_per_call("retain")
  # 64 MiB is 16384 pages.
  assert default > 10000, default
  assert retained < default / 10, (default, retained)


BACKEND_SCRIPT = """
import json, sys
from transformer.cpu import host_memory
print(json.dumps([host_memory.cpu_backend(), host_memory.retain_freed_memory(),
                  "jax._src.xla_bridge" in sys.modules and
                  bool(sys.modules["jax._src.xla_bridge"]._backends)]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt only")
@pytest.mark.parametrize("platforms,plugin,want", [
    ("cpu", False, True), ("cuda", False, False), ("tpu,cpu", False, False),
    ("", False, True),    # nothing chosen, no accelerator installed: JAX uses the CPU
    ("", True, False),    # an accelerator plugin installed (jax[cuda12] / a TPU VM): skip
    ("cpu", True, True),  # ... unless the run asks for the CPU
])
def test_malloc_settings_apply_only_on_the_cpu_backend(tmp_path, platforms, plugin, want):
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  path = [ROOT]
  if plugin:  # a PJRT plugin module in JAX's namespace package, as jax_cuda12_plugin ships
    (tmp_path / "jax_plugins" / "fake_accelerator").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "fake_accelerator" / "__init__.py").write_text("")
    path.append(str(tmp_path))
  env.update(PYTHONPATH=os.pathsep.join(path), **({"JAX_PLATFORMS": platforms} if platforms
                                                   else {}))
  out = subprocess.run([sys.executable, "-c", BACKEND_SCRIPT], env=env, check=True,
                       capture_output=True, text=True).stdout
  on_cpu, applied, started = json.loads(out.split("\n")[-2])
  assert (on_cpu, applied) == (want, want)
  assert not started  # deciding started no backend (and so no XLA threads)


def _config(**model):
  from transformer import schema  # pylint: disable=g-import-not-at-top
  m = dict(kind="decoder", vocab_size=256, d_model=256, num_layers=4, num_heads=4, d_ff=1024)
  m.update(model)
  return schema.experiment_config(schema.model_config(**m),
                                  schema.ml_collections.ConfigDict(dict(seq_len=256)),
                                  schema.objective_config("lm"), batch_size=16, steps=10)


def test_large_step_follows_tokens_width_and_depth():
  from transformer.training import host  # pylint: disable=g-import-not-at-top
  w1 = _config()  # 4,096 tokens x 256 x 4 layers: the W1 workload, 465 MB of temporaries
  assert host.large_step(w1)
  assert not host.large_step(_config(num_layers=2))  # half the depth: below the threshold
  w1.opt.grad_accum_steps = 2  # a micro-batch of half the tokens
  assert not host.large_step(w1)
  # An encoder-decoder counts both towers.
  assert host.large_step(_config(kind="encoder_decoder", num_layers=2))
  assert not host.large_step(_config(kind="encoder_decoder", num_layers=2,
                                     num_encoder_layers=1, num_decoder_layers=1))


DISPATCH_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from host_memory_test import _config
from transformer.training import host
import jax
retained = host.configure_host([_config(num_layers=int(sys.argv[2]))],
                               retain_host_memory=sys.argv[3] == "retain")
print(json.dumps([retained, jax.config.values["jax_cpu_enable_async_dispatch"]]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt only")
@pytest.mark.parametrize("layers,mode,want", [
    (4, "retain", [True, False]),    # a large step on the retained heap: synchronous
    (2, "retain", [True, True]),     # a small one keeps asynchronous dispatch
    (4, "default", [False, True]),   # glibc's own malloc returns memory: nothing to avoid
])
def test_large_steps_on_the_retained_heap_dispatch_synchronously(layers, mode, want):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", DISPATCH_SCRIPT, os.path.dirname(__file__),
                        str(layers), mode], env=env, check=True, capture_output=True,
                       text=True).stdout
  assert json.loads(out.split("\n")[-2]) == want
