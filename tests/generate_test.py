"""The generate CLI on real (tiny, two-step) training runs: decoder and encoder-decoder."""

import os
import subprocess
import sys

import pytest

from helpers import tiny_run
from transformer import generate
from transformer.training import loop

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def trained(tmp_path_factory, data_dir, family, **data):
  workdir = str(tmp_path_factory.mktemp(family))
  config = tiny_run.tiny_config(data_dir, family, **{"train.steps": 2})
  config.data.update(data)
  loop.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def lm_workdir(tmp_path_factory, data_dir):
  return trained(tmp_path_factory, data_dir, "lm")


@pytest.fixture(scope="module")
def seq2seq_workdir(tmp_path_factory, data_dir):
  return trained(tmp_path_factory, data_dir, "seq2seq", max_length=8, seq_len=16)


def cli(*flags):
  env = dict(os.environ, PYTHONIOENCODING="utf-8")
  return subprocess.run([sys.executable, "-m", "transformer.generate", *flags],
                        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_cli_prints_the_seeded_continuation(lm_workdir):
  flags = dict(max_new_tokens=6, temperature=1.0, top_k=20, seed=3)
  proc = cli("--workdir", lm_workdir, "--prompt", "The cat",
             *[f"--{k}={v}" for k, v in flags.items()])
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Same seed, same sample: in another process, through the library.
  assert proc.stdout == generate.continuation(lm_workdir, "The cat", **flags) + "\n"


def test_cli_decodes_with_a_bfloat16_cache(lm_workdir):
  """--cache_dtype reaches the model: the CLI prints the library's continuation. (Its text may
  leave the float32 cache's at a near-tie: tests/cpu_cached_attention_test.py bounds the
  logits instead.)"""
  proc = cli("--workdir", lm_workdir, "--prompt", "The cat", "--max_new_tokens=8",
             "--cache_dtype=bfloat16")
  assert proc.returncode == 0, proc.stderr[-2000:]
  half = generate.continuation(lm_workdir, "The cat", max_new_tokens=8, cache_dtype="bfloat16")
  assert proc.stdout == half + "\n"


def test_encoder_decoder_run_generates_greedy_and_beam(seq2seq_workdir):
  greedy = generate.continuation(seq2seq_workdir, "abc", max_new_tokens=6)
  beam = generate.continuation(seq2seq_workdir, "abc", max_new_tokens=6, beam_size=3)
  assert isinstance(greedy, str) and isinstance(beam, str)


def test_cli_refuses_bad_settings_in_one_line(lm_workdir):
  proc = cli("--workdir", lm_workdir, "--prompt", "x", "--top_p=1.5")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1].startswith("error: top_p must be in (0, 1]")


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt=""), "empty --prompt"),
    (dict(beam_size=0), "beam_size must be >= 1"),
    (dict(beam_size=2, temperature=0.7), "beam search is deterministic"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(beam_size=4, length_penalty=-1.0), r"--length_penalty must be >= 0"),
    (dict(beam_size=4, length_penalty=float("nan")), r"--length_penalty must be >= 0"),
    (dict(cache_dtype="int8"), r"--cache_dtype 'int8': use one of \['float32', 'bfloat16'"),
])
def test_bad_settings_fail_before_loading(tmp_path, kwargs, message):
  args = dict(prompt="x")
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    generate.continuation(str(tmp_path), args.pop("prompt"), **args)


def test_a_step_that_was_not_saved_lists_the_saved_ones(lm_workdir):
  with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 99 under .*; saved "
                                              r"steps: \[\d"):
    generate.continuation(lm_workdir, "x", step=99)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint under"):
    generate.continuation(str(tmp_path), "x")


def test_a_missing_or_hugging_face_workdir_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"--workdir .*typo does not exist; give a run "):
    generate.continuation(str(tmp_path / "typo"), "x")
  (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
  with pytest.raises(ValueError, match=r"is a Hugging Face checkpoint .*convert it first: "
                                       r"python -m transformer.convert --from_hf"):
    generate.continuation(str(tmp_path), "x")
