"""Nothing a user saved is lost: a conversion (transformer.convert, interop.hf, interop.workdirs)
refuses a destination holding a run or a model, keeps other files, and says so in one line."""

import json
import os

import jax
import numpy as np
import pytest

from tests.helpers.damage import flip
from tests.helpers.tiny_models import init_params as _init, ours as _ours
from transformer.interop import hf, workdirs

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)


def test_workdir_round_trip(tmp_path):
  cfg = _ours("gpt2")
  variables = _init(cfg)
  workdirs.save_workdir(cfg, variables, str(tmp_path / "run"))
  assert os.path.exists(tmp_path / "run" / "config.json")
  back_cfg, back = workdirs.load_workdir(str(tmp_path / "run"))
  assert hf._arch(back_cfg) == hf._arch(cfg)
  jax.tree.map(np.testing.assert_array_equal, back["params"], variables["params"])


def test_an_interrupted_conversion_leaves_nothing_for_the_retry_to_refuse(tmp_path,
                                                                          monkeypatch):
  from transformer.training import checkpoint
  cfg = _ours("gpt2")
  variables = _init(cfg)
  real = checkpoint.save

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(checkpoint, "save", interrupted)
  for to in (tmp_path / "new" / "run", tmp_path / "empty"):
    if to.name == "empty":
      to.mkdir()
    with pytest.raises(KeyboardInterrupt):
      workdirs.save_workdir(cfg, variables, str(to))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no half-written run
  assert not any((tmp_path / "empty").iterdir())
  monkeypatch.setattr(checkpoint, "save", real)
  workdirs.save_workdir(cfg, variables, str(tmp_path / "empty"))  # the retry
  assert sorted(os.listdir(tmp_path / "empty")) == ["checkpoints", "config.json"]


def test_export_of_a_missing_or_damaged_step_names_the_saved_steps(tmp_path):
  """--from WORKDIR --step N reads only an intact checkpoint of a step the run saved."""
  cfg = _ours("gpt2")
  run = str(tmp_path / "run")
  workdirs.save_workdir(cfg, _init(cfg), run)
  with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 5 under .*run/checkpoints; "
                     r"saved steps: \[0\]"):
    workdirs.load_workdir(run, 5)
  step_dir = os.path.join(run, "checkpoints", "0")
  assert os.path.exists(os.path.join(step_dir, "sha256sums.json"))  # as a trained run's steps
  flip(step_dir)
  with pytest.raises(ValueError, match=r"the step-0 checkpoint in .* is damaged"):
    workdirs.load_workdir(run)


# Nothing a user saved is lost: a conversion refuses a destination holding a run or a model.

def _snapshot(path):
  """Every file under `path`, relative name -> bytes."""
  files = {}
  for d, _, names in os.walk(path):
    for name in names:
      with open(os.path.join(d, name), "rb") as f:
        files[os.path.relpath(os.path.join(d, name), path)] = f.read()
  return files


def _existing(kind, path):
  """A directory a user could point a conversion at: a training run (checkpoints, metrics),
  a Hugging Face export (single file or shards), or one holding someone's notes."""
  cfg = _ours("gpt2", num_layers=1)
  if kind == "run":
    workdirs.save_workdir(cfg, _init(cfg, seed=1), path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
      f.write('{"step": 100, "loss": 2.5}\n')
  elif kind in ("hf", "hf_sharded"):
    hf.to_hf(cfg, _init(cfg, seed=1), path,
                  max_shard_bytes=4096 if kind == "hf_sharded" else 5 * 10**9)
  else:
    os.makedirs(path)
    with open(os.path.join(path, "notes.txt"), "w") as f:
      f.write("keep me")
  return _snapshot(path)


@pytest.mark.parametrize("kind", ["run", "hf", "other"])
def test_import_refuses_a_directory_that_is_not_empty(kind, tmp_path):
  """Step 0 saved with keep=1 would prune a run's checkpoints; config.json would be
  overwritten (the HF source's own, when --to is --from_hf)."""
  src, dst = str(tmp_path / "hf"), str(tmp_path / kind)
  if kind == "hf":
    dst = src
  before = _existing(kind, dst)
  if kind != "hf":
    _existing("hf", src)
  cfg, variables = hf.from_hf(src)
  with pytest.raises(FileExistsError, match=r"already exists and is not empty; convert into a "
                                             r"new directory \(nothing was written\)"):
    workdirs.save_workdir(cfg, variables, dst, tokenizer_dir=src)
  assert _snapshot(dst) == before


def test_import_into_an_empty_directory(tmp_path):
  _existing("hf", str(tmp_path / "hf"))
  os.makedirs(tmp_path / "run")
  cfg, variables = hf.from_hf(str(tmp_path / "hf"))
  workdirs.save_workdir(cfg, variables, str(tmp_path / "run"))
  assert os.path.exists(tmp_path / "run" / "config.json")


@pytest.mark.parametrize("kind,held", [
    ("hf", "config.json, model.safetensors"),
    ("hf_sharded", "config.json, model-00001-of-"),  # no single file a new one could hide
    ("run", "checkpoints, config.json")])
def test_export_refuses_a_directory_holding_a_model(kind, held, tmp_path):
  dst = str(tmp_path / kind)
  before = _existing(kind, dst)
  cfg = _ours("llama", num_layers=1)
  with pytest.raises(FileExistsError, match=rf"{dst} already holds {held}.*; export to a new "
                                            r"directory \(nothing was written\)"):
    hf.to_hf(cfg, _init(cfg), dst)
  assert _snapshot(dst) == before


def test_export_keeps_other_files(tmp_path):
  """A tokenizer put in the destination first is no obstacle, and is left as it was."""
  with open(tmp_path / "tokenizer.json", "w") as f:
    f.write("{}")
  cfg = _ours("llama", num_layers=1)
  hf.to_hf(cfg, _init(cfg), str(tmp_path))
  assert (tmp_path / "tokenizer.json").read_text() == "{}"
  assert os.path.exists(tmp_path / "model.safetensors")


def test_export_keeps_the_tokenizer_files_already_there(tmp_path):
  """convert --to_hf puts the run's tokenizer beside the model, but not over one the user put
  in the destination first; the log line says which were kept."""
  run, dst = tmp_path / "run", tmp_path / "dst"
  (run / "tokenizer").mkdir(parents=True)
  (run / "config.json").write_text('{"data": {"tokenizer": "huggingface"}}')
  for name in ("tokenizer.json", "generation_config.json"):
    (run / "tokenizer" / name).write_text("the run's")
  dst.mkdir()
  (dst / "tokenizer.json").write_text("the user's")
  note = workdirs.export_tokenizer(str(run), str(dst), "decoder")
  assert (dst / "tokenizer.json").read_text() == "the user's"
  assert (dst / "generation_config.json").read_text() == "the run's"
  assert "generation_config.json copied; tokenizer.json already in" in note and "kept" in note


def test_export_records_the_runs_special_ids(tmp_path):
  """The exported config.json carries the ids the run trained with (its special_ids.json),
  not the exporter's defaults (T5's eos=1 and decoder start 0; GPT-2's 50256)."""
  tokenizers = pytest.importorskip("tokenizers")
  run, dst = tmp_path / "run", tmp_path / "dst"
  (run / "tokenizer").mkdir(parents=True)
  (run / "config.json").write_text('{"data": {"tokenizer": "huggingface"}}')
  vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", "a"])}
  tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>")).save(
      str(run / "tokenizer" / "tokenizer.json"))
  (run / "tokenizer" / "special_ids.json").write_text('{"pad": 0, "bos": 1, "eos": 2}')
  dst.mkdir()
  (dst / "config.json").write_text('{"pad_token_id": 0, "eos_token_id": 1, '
                                   '"decoder_start_token_id": 0}')
  assert "special ids recorded" in workdirs.export_tokenizer(str(run), str(dst),
                                                             "encoder_decoder")
  hf = json.loads((dst / "config.json").read_text())
  assert [hf[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                          "decoder_start_token_id")] == [0, 1, 2, 1]


@pytest.mark.parametrize("case", ["import_into_run", "export_into_run", "missing_flag",
                                  "not_writable"])
def test_command_line_errors_are_one_line(case, tmp_path):
  """Refusals, input mistakes and a flag left out: one line on stderr, exit 1, and nothing a
  user saved is touched."""
  import subprocess
  import sys
  run, hf = str(tmp_path / "run"), str(tmp_path / "hf")
  if case == "not_writable":  # a run whose model no HF family expresses
    cfg = _ours("llama", num_layers=1, ffn="gelu")
    workdirs.save_workdir(cfg, _init(cfg), run)
    before = _snapshot(run)
  else:
    before = _existing("run", run)
    _existing("hf", hf)
  args, message = {
      "import_into_run": (["--from_hf", hf, "--to", run],
                          f"{run} already exists and is not empty; convert into a new directory"),
      "export_into_run": (["--from", run, "--to_hf", run],
                          f"{run} already holds checkpoints, config.json; export to a new"),
      "missing_flag": (["--from_hf", hf], "use --from_hf SRC_DIR --to WORKDIR, or --from"),
      "not_writable": (["--from", run, "--to_hf", str(tmp_path / "out")],
                       "llama uses a gated feed-forward; model.ffn='gelu' is not one"),
  }[case]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-m", "transformer.convert", *args], cwd=root,
                        capture_output=True, text=True)
  assert done.returncode == 1, done.stderr
  assert done.stderr.strip().startswith("error: ") and message in done.stderr, done.stderr
  assert len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert _snapshot(run) == before
  assert not os.path.exists(tmp_path / "out")


def test_import_refuses_special_ids_its_tokenizer_lacks(tmp_path):
  """A checkpoint whose config.json names ids beyond its tokenizer.json (GPT2Config's 50256
  beside a small tokenizer) is refused before anything is written, naming the ids."""
  tokenizers = pytest.importorskip("tokenizers")
  src = tmp_path / "hf"
  cfg = _ours("gpt2")
  hf.to_hf(cfg, _init(cfg), str(src))
  vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", "the", "keys"])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.save(str(src / "tokenizer.json"))
  hf_config = json.loads((src / "config.json").read_text())
  hf_config.update(bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
  (src / "config.json").write_text(json.dumps(hf_config))
  with pytest.raises(ValueError, match=r"names special ids \{'bos': 50256, 'eos': 50256\} "
                                       r"outside its tokenizer.json's 6 tokens"):
    workdirs.save_workdir(cfg, _init(cfg), str(tmp_path / "run"), tokenizer_dir=str(src))
  assert not os.path.exists(tmp_path / "run")
  hf_config.update(bos_token_id=1, eos_token_id=2)  # in range: converts
  (src / "config.json").write_text(json.dumps(hf_config))
  workdirs.save_workdir(cfg, _init(cfg), str(tmp_path / "run"), tokenizer_dir=str(src))
  assert json.loads((tmp_path / "run" / "tokenizer" / "special_ids.json").read_text()) == {
      "pad": None, "bos": 1, "eos": 2}


def test_export_refuses_a_stale_index(tmp_path):
  """A model.safetensors.index.json left behind (its shards deleted) is refused: a new single
  model.safetensors beside it would not be the file read back (from_hf reads an index first)."""
  dst = tmp_path / "hf"
  dst.mkdir()
  (dst / "model.safetensors.index.json").write_text('{"weight_map": {}}')
  cfg = _ours("llama", num_layers=1)
  with pytest.raises(FileExistsError, match=r"already holds model.safetensors.index.json; "
                                            r"export to a new directory"):
    hf.to_hf(cfg, _init(cfg), str(dst))
