"""Fine-tuning (train.init_from) and a run's history across kills (metrics.jsonl, TensorBoard).

The subprocess and end-to-end tests are slow; the metrics.jsonl reader tests are not.
"""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import tiny_run
from tests.helpers.damage import flip
from transformer.data import tokenizers
from transformer.training import init_from, metrics_file, tensorboard_events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_RUN = os.path.join(ROOT, "tests", "helpers", "tiny_run.py")


def _env():
  return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _tiny(workdir, data_dir, *sets, check=True, extra=()):
  """tests/helpers/tiny_run.py in a subprocess; (returncode, stdout, stderr)."""
  args = [sys.executable, TINY_RUN, "--workdir", str(workdir), "--data_dir", data_dir,
          *extra, *(a for s in sets for a in ("--set", s))]
  done = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True)
  if check and done.returncode != 0:
    raise AssertionError(f"tiny run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
  return done.returncode, done.stdout, done.stderr


def _rows(workdir):
  return metrics_file.read(os.path.join(workdir, "metrics.jsonl"), warn=None)


# ---------------------------------------------------------------------------------------------
# train.init_from: from a training run

@pytest.mark.slow
def test_init_from_a_run_starts_at_its_loss_and_resumes_itself(data_dir, tmp_path):
  src, ft = tmp_path / "src", tmp_path / "ft"
  _tiny(src, data_dir, "train.steps=40", "train.checkpoint_every=40")
  source_losses = [r["loss"] for r in _rows(src)]
  sets = (f"train.init_from={src}", "train.steps=10", "train.checkpoint_every=2",
          "opt.lr=0.003")
  # SIGTERM while fetching step 4's batch: the run saves step 4 and exits.
  _, out, _ = _tiny(ft, data_dir, *sets, extra=("--signal_at_step", "4:SIGTERM"))
  assert f"initialized from {src} step 40" in out
  first = _rows(ft)[0]["loss"]
  ln_v = math.log(260)
  recent = sum(source_losses[-5:]) / 5
  assert first < ln_v - 2.0, (first, ln_v)  # not a random init
  assert abs(first - recent) < 0.3, (first, recent)
  # The source is gone: resuming must read only this run's own checkpoint.
  os.rename(src, tmp_path / "moved")
  _, out, _ = _tiny(ft, data_dir, *sets)
  assert "resumed from step 4" in out and "initialized from" not in out
  rows = _rows(ft)
  assert [r["step"] for r in rows] == list(range(1, 11))
  losses = [r["loss"] for r in rows]
  assert sum(losses[-3:]) / 3 < first, losses  # goes on learning
  with open(ft / "config.json") as f:
    assert json.load(f)["train"]["init_from"] == str(src)
  with open(ft / "summary.json") as f:
    assert json.load(f)["config"]["train.init_from"] == str(src)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mismatch", "no_checkpoints", "missing_step", "damaged"])
def test_init_from_errors_are_one_line_before_compute(case, data_dir, tmp_path):
  src = tmp_path / "src"
  if case == "no_checkpoints":
    src.mkdir()
    spec, needle = str(src), "checkpoints not found"
  else:
    _tiny(src, data_dir, "train.steps=2")
    spec, needle = {
        "mismatch": (str(src), "model.d_model, model.num_heads differ"),
        "missing_step": (f"{src}:7", "no checkpoint of step 7"),
        "damaged": (str(src), f"the step-2 checkpoint in {src}/checkpoints is damaged (params/"),
    }[case]
    if case == "damaged":
      flip(str(src / "checkpoints" / "2"))
  cmd = [sys.executable, "-m", "transformer.train", "--config=configs/lm.py:size=xs",
         f"--workdir={tmp_path / 'ft'}", f"--config.train.init_from={spec}",
         "--config.data.size=tiny", f"--config.data.data_dir={data_dir}"]
  if case == "mismatch":
    cmd += ["--config.model.d_model=32", "--config.model.num_heads=4", "--config.model.max_len=64",
            "--config.model.attention=dense"]  # runtime keys may differ: not named
  done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
  assert done.returncode != 0
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: train.init_from=") and needle in lines[0]
  assert "attention" not in lines[0].split("only")[0]
  assert "compiled" not in done.stdout and not (tmp_path / "ft").exists()


# ---------------------------------------------------------------------------------------------
# train.init_from: from a converted Hugging Face checkpoint

def _bpe_tokenizer(path, data_config, vocab_size, seq2seq):
  """A BPE tokenizer.json trained on the run's corpus (no download). Decoders: ids 0-2 are
  pad, bos, eos; T5 (seq2seq): pad, eos, on characters (the algorithmic tasks' symbols)."""
  tokenizers = pytest.importorskip("tokenizers")
  from transformer.data import sources
  dataset = sources.load(data_config, "train")
  texts = [t for i in range(min(len(dataset), 300)) for t in sources.record_texts(dataset[i])]
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
  if seq2seq:
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    specials = ["<pad>", "</s>", "<unk>"]
  else:
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tok.decoder = tokenizers.decoders.Metaspace()
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
  tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=specials, show_progress=False))
  tok.save(os.path.join(path, "tokenizer.json"))


def _hf_model(name, T, vocab_size):
  ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
  if name == "gpt2":
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2,
                                          n_head=4, n_positions=64, **ids))
  if name == "t5":
    return T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=vocab_size, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
  return T.LlamaForCausalLM(T.LlamaConfig(  # GQA, untied head
      vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      tie_word_embeddings=False, **ids))


def _hf_loss(torch, model, batch, seq2seq):
  """transformers' mean NLL on our batch, weighted as the trainer weights it."""
  import numpy as np
  L = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  model.eval()  # a model built from a config is in training mode: dropout on
  with torch.no_grad():
    if seq2seq:
      logits = model(input_ids=L(batch["encoder_inputs"]),
                     attention_mask=L(batch["encoder_segment_ids"] > 0),
                     decoder_input_ids=L(batch["decoder_inputs"]),
                     decoder_attention_mask=L(batch["decoder_segment_ids"] > 0)).logits
      targets, weights = batch["decoder_targets"], batch["decoder_weights"]
    else:
      logits = model(input_ids=L(batch["inputs"]),
                     attention_mask=L(batch["segment_ids"] > 0)).logits
      targets, weights = batch["targets"], batch["weights"]
    nll = -torch.log_softmax(logits.double(), -1).gather(-1, L(targets)[..., None])[..., 0]
  weights = np.asarray(weights, np.float64)
  return float((nll.numpy() * weights).sum() / weights.sum())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "t5"])
def test_fine_tune_a_converted_checkpoint(name, data_dir, tmp_path):
  """save_pretrained -> transformer.convert --from_hf -> transformer.train with
  configs/finetune.py: step 1's loss is the HF model's loss on that very batch."""
  torch = pytest.importorskip("torch")
  T = pytest.importorskip("transformers")
  T.logging.set_verbosity_error()
  seq2seq = name == "t5"
  vocab = 64 if seq2seq else 96
  hf_dir, conv, ft = tmp_path / "hf", tmp_path / "conv", tmp_path / "ft"
  hf_dir.mkdir()
  from transformer.data import pipeline
  data_config = pipeline.default_config()  # the data the converted run's config names
  data_config.update(dict(name="algorithmic", task="reverse") if seq2seq else dict(size="tiny"))
  data_config.data_dir = data_dir
  _bpe_tokenizer(str(hf_dir), data_config, vocab, seq2seq)
  torch.manual_seed(0)
  model = _hf_model(name, T, vocab)
  model.save_pretrained(hf_dir)
  run = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=_env(),
                                     check=True, capture_output=True, text=True)
  run("transformer.convert", "--from_hf", str(hf_dir), "--to", str(conv))
  # One document (example) per row (packing=False), so transformers sees the same attention.
  out = run("transformer.train", f"--config=configs/finetune.py:from={conv},steps=6,lr=0.01",
            f"--workdir={ft}", f"--config.data.data_dir={data_dir}",
            *([] if seq2seq else ["--config.data.size=tiny", "--config.data.seq_len=32"]),
            "--config.data.packing=False",
            "--config.train.batch_size=8", "--config.train.log_every=1",
            "--config.train.eval_batches=1", "--config.model.dropout_rate=0.0",
            "--config.model.attention_dropout_rate=0.0").stdout
  assert f"initialized from {conv} step 0" in out and "tokenizer.json" in out
  assert (ft / "tokenizer" / "tokenizer.json").exists()  # the run is self-contained
  losses = [r["loss"] for r in _rows(ft)]

  # The trainer's first batch, from the same pipeline and config.
  import ml_collections
  from transformer.data import tokenizers
  from transformer.data.shards import ShardedBatches
  with open(ft / "config.json") as f:
    config = ml_collections.ConfigDict(json.load(f))
  tokenizer = tokenizers.HuggingFaceTokenizer(str(ft / "tokenizer"))
  batch = next(ShardedBatches(config, tokenizer, split=config.train.train_split,
                              objective=config.objective.name, seed=config.train.seed,
                              num_shards=config.train.data_shards))
  hf_loss = _hf_loss(torch, model, batch, seq2seq)
  print(f"{name}: transformers loss {hf_loss:.6f}, first step {losses[0]:.6f}, "
        f"then {[round(x, 4) for x in losses[1:]]}")
  assert abs(losses[0] - hf_loss) < 1e-4, (losses[0], hf_loss)
  assert losses[-1] < losses[0] - 0.1, losses


# ---------------------------------------------------------------------------------------------
# metrics.jsonl and TensorBoard across kills

def test_reader_drops_a_torn_last_line_and_names_the_file(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
  warnings = []
  assert [r["step"] for r in metrics_file.read(path, warn=warnings.append)] == [1, 2]
  assert len(warnings) == 1 and path in warnings[0] and "torn last line" in warnings[0]
  with open(path, "a") as f:
    f.write("\n")  # cut, then a newline made it: still the last line
  assert [r["step"] for r in metrics_file.read(path, warn=None)] == [1, 2]
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2\n{"step": 3}\n')
  with pytest.raises(ValueError, match=f"{path}: line 2"):
    metrics_file.read(path)


def test_cut_back_keeps_rows_up_to_the_step(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write("".join(json.dumps({"step": s}) + "\n" for s in range(1, 7)) + '{"step": 7')
  note = metrics_file.cut_back(path, 4, warn=None)
  assert "dropped 2 past it and a torn last line" in note
  with open(path) as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4]
  assert metrics_file.cut_back(path, 4, warn=None) is None
  assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_readers_report_a_torn_line_on_stderr(tmp_path, capsys):
  """What the scripts' reader (experiments.scaling.fit, estimate, tests/helpers/tiny_run)
  does by default: the torn line is reported on stderr, naming the file, not a JSON error."""
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 10, "loss": 3.0, "eval_loss": 3.1}\n{"step": 20, "loss"')
  assert [r["step"] for r in metrics_file.read(path)] == [10]
  assert path in capsys.readouterr().err


def _tensorboard_steps(workdir):
  logdir = os.path.join(workdir, "tensorboard")
  steps, starts = [], []
  for name in sorted(os.listdir(logdir)):
    path = os.path.join(logdir, name)
    steps += [s for s, tag, _ in tensorboard_events.read_scalars(path) if tag == "loss"]
    starts += [e.step for e in tensorboard_events.read_events(path) if e.HasField("session_log")]
  return sorted(steps), starts


@pytest.mark.slow
def test_kill9_mid_save_then_resume_logs_every_step_once(data_dir, tmp_path):
  work = tmp_path / "run"
  sets = ("train.steps=8", "train.checkpoint_every=2")
  code, _, _ = _tiny(work, data_dir, *sets, check=False,
                     extra=("--kill_during_save_of_step", "4"))
  assert code == -signal.SIGKILL
  logged = [r["step"] for r in _rows(work)]  # the save is async: steps past 4 may be logged
  assert logged == list(range(1, len(logged) + 1)) and len(logged) >= 4
  # A cut line on top, as a kill mid-write leaves it.
  with open(work / "metrics.jsonl", "a") as f:
    f.write('{"step": 5, "loss": 1.')
  _, out, _ = _tiny(work, data_dir, *sets)
  assert "resumed from step 2" in out and "torn last line" in out
  assert f"dropped {len(logged) - 2} past it and a torn last line" in out
  with open(work / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f]  # every line parses
  assert steps == list(range(1, 9))
  tb_steps, starts = _tensorboard_steps(work)
  assert tb_steps == list(range(1, 9)) and starts == [3]  # SessionLog START at step 3


@pytest.mark.slow
def test_a_torn_last_line_resumes_cleanly(data_dir, tmp_path):
  work = tmp_path / "run"
  _tiny(work, data_dir, "train.steps=4", "train.checkpoint_every=2")
  with open(work / "metrics.jsonl", "rb+") as f:  # the last row cut in half
    data = f.read()
    f.seek(0)
    f.truncate()
    f.write(data[:-20])
  _, out, _ = _tiny(work, data_dir, "train.steps=6", "train.checkpoint_every=2")
  assert "resumed from step 4" in out and "torn last line" in out
  with open(work / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f]
  assert steps == [1, 2, 3, 5, 6]  # step 4's row was lost with the cut, nothing is glued


@pytest.mark.slow
def test_init_from_restores_across_param_dtype_and_scan_layers(data_dir, tmp_path):
  """Storage keys may differ: a float32 per-layer source into a bfloat16 scanned run (cast
  and restacked on the devices) starts where the source ended."""
  from transformer.training import loop
  src = str(tmp_path / "src")
  loop.train_and_evaluate(tiny_run.tiny_config(data_dir, **{"train.steps": 30}), src)
  last = [r["loss"] for r in _rows(src)][-5:]
  config = tiny_run.tiny_config(data_dir, **{
      "train.steps": 3, "train.init_from": src, "model.param_dtype": "bfloat16",
      "model.dtype": "bfloat16", "model.scan_layers": True, "opt.lr": 1e-3})
  loop.train_and_evaluate(config, str(tmp_path / "ft"))
  first = _rows(str(tmp_path / "ft"))[0]["loss"]
  assert abs(first - sum(last) / 5) < 0.3, (first, last)


# ---------------------------------------------------------------------------------------------
# train.init_from: what is refused before anything is written

def test_init_from_may_not_be_the_workdir_or_nested_with_it(tmp_path):
  from transformer.training import init_from
  run, link = tmp_path / "run", tmp_path / "link"
  run.mkdir()
  link.symlink_to(run)
  def check(source, workdir):
    init_from.check_workdir(tiny_run.tiny_config(str(tmp_path), **{
        "train.init_from": str(source)}), str(workdir))
  for source in (run, f"{run}:5", link, f"{run}/"):  # resuming it would prune its checkpoints
    with pytest.raises(ValueError, match=r"is this run's --workdir .*; pick a new --workdir"):
      check(source, run)
  with pytest.raises(ValueError, match=r"holds this run's --workdir .*run/ft; pick a new"):
    check(run, run / "ft")
  with pytest.raises(ValueError, match=r"lies inside this run's --workdir"):
    check(run / "ft", run)
  check(run, tmp_path / "run_warm")  # a sibling sharing a prefix (the probes' warm-ups)
  check("", run)


def test_a_hugging_face_or_corrupt_config_json_is_one_line(tmp_path):
  from transformer.training import init_from
  (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
  with pytest.raises(ValueError, match=r"^--workdir: .* is a Hugging Face checkpoint \(model_type "
                                       r"'gpt2'\), not a run directory; convert it first: python "
                                       r"-m transformer.convert --from_hf "):
    init_from.read_run_config(str(tmp_path), "--workdir")
  (tmp_path / "config.json").write_text('{"model": ')
  with pytest.raises(ValueError, match=r"config.json is not valid JSON \(Expecting value: line 1"):
    init_from.read_run_config(str(tmp_path), "--workdir")
  (tmp_path / "config.json").write_text("[1]")
  with pytest.raises(ValueError, match=r"has no 'model' block"):
    init_from.read_run_config(str(tmp_path), "--workdir")
  (tmp_path / "config.json").write_text('{"model": {"kind": "decoder"}}')
  assert init_from.read_run_config(str(tmp_path), "x") == {"model": {"kind": "decoder"}}


def test_training_into_a_hugging_face_folder_is_refused_before_writing(tmp_path):
  from transformer.training import init_from, loop
  hf = tmp_path / "gpt2"
  hf.mkdir()
  (hf / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
  (hf / "model.safetensors").write_bytes(b"weights")
  with pytest.raises(ValueError, match=r"^--workdir .*gpt2 is a Hugging Face checkpoint "
                                       r"\(model_type 'gpt2'\): its config.json is not a run's"):
    loop.train_and_evaluate(tiny_run.tiny_config(str(tmp_path)), str(hf))
  assert sorted(os.listdir(hf)) == ["config.json", "model.safetensors"]  # nothing moved aside
  (hf / "config.json").write_text("[]")
  with pytest.raises(ValueError, match=r"is not a run directory: its config.json"):
    init_from.check_own_config(str(hf))
  for own in ('{"model": {"kind": "decoder"}}', '{"model": '):  # a run's, whole or cut short
    (hf / "config.json").write_text(own)
    init_from.check_own_config(str(hf))
  init_from.check_own_config(str(tmp_path / "new"))


def _source(tmp_path, tokenizer="bytes"):
  src = tmp_path / "src"
  (src / "tokenizer").mkdir(parents=True)
  (src / "tokenizer" / "a.json").write_text("source a")
  (src / "tokenizer" / "b.json").write_text("source b")
  config = tiny_run.tiny_config(str(tmp_path), **{"data.tokenizer": tokenizer})
  return init_from.Source(str(src), str(src), 0, config)


def test_the_source_tokenizer_is_carried_without_replacing_the_run_s_own(tmp_path):
  """carry_tokenizer copies the source's files this run lacks, keeps those it has, and copies
  nothing when this run sets another tokenizer."""
  source = _source(tmp_path)
  ft = tmp_path / "ft"
  (ft / "tokenizer").mkdir(parents=True)
  (ft / "tokenizer" / "a.json").write_text("the run's own a")
  note = init_from.carry_tokenizer(source, tiny_run.tiny_config(str(tmp_path)), str(ft))
  assert note.endswith("(b.json)"), note
  assert (ft / "tokenizer" / "a.json").read_text() == "the run's own a"
  assert (ft / "tokenizer" / "b.json").read_text() == "source b"
  other = tmp_path / "other"
  note = init_from.carry_tokenizer(source, tiny_run.tiny_config(
      str(tmp_path), **{"data.tokenizer": "sentencepiece"}), str(other))
  assert "not the source's 'bytes'" in note and not other.exists()


def test_a_sentencepiece_model_is_carried_to_the_name_this_run_looks_for(tmp_path):
  """The model's file name hashes the data config: a fine-tune on other data (other size here)
  finds the source's model under its own name, instead of training a new one."""
  src = tmp_path / "src"
  (src / "tokenizer").mkdir(parents=True)
  theirs = tiny_run.tiny_config(str(tmp_path), **{"data.tokenizer": "sentencepiece",
                                                  "data.size": "tiny"})
  ours = tiny_run.tiny_config(str(tmp_path), **{"data.tokenizer": "sentencepiece",
                                                "data.size": "small"})
  theirs_path = tokenizers.sentencepiece_path(theirs.data, str(src / "tokenizer"))
  with open(theirs_path, "w") as f:
    f.write("the source's model")
  ft = tmp_path / "ft"
  init_from.carry_tokenizer(init_from.Source(str(src), str(src), 0, theirs), ours, str(ft))
  ours_path = tokenizers.sentencepiece_path(ours.data, str(ft / "tokenizer"))
  assert ours_path != theirs_path.replace(str(src), str(ft))
  with open(ours_path) as f:
    assert f.read() == "the source's model"
