"""Checkpoint retention (last N plus best), round trips, and the compatibility check."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from helpers import tiny_run
from helpers.damage import flip
from transformer import data
from transformer.training import checkpoint, checkpoint_integrity


def test_keeps_the_last_n_and_the_best_and_round_trips(tmp_path):
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), keep=2, keep_best=1)
  eval_losses = {2: 0.5, 4: 0.9}
  for step in range(1, 6):
    checkpoint.save(manager, step, tiny_run.toy_state(step), {"0": {"pos": step}}, config,
                    eval_loss=eval_losses.get(step))
  manager.wait_until_finished()
  assert manager.all_steps() == [2, 4, 5]  # 2 is the best eval, 4 and 5 the latest
  assert manager.best_step() == 2

  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tiny_run.toy_state(0))
  state, data_state = checkpoint.restore(manager, 4, abstract)
  np.testing.assert_array_equal(state["params"]["w"], np.full((2, 3), 4.0))
  assert int(state["step"]) == 4 and data_state == {"0": {"pos": 4}}
  np.testing.assert_array_equal(state["rng"], tiny_run.toy_state(0)["rng"])
  assert checkpoint.read_config(manager, 4).model.d_model == config.model.d_model
  manager.close()


def test_compatibility_allows_runtime_keys_and_names_real_differences(tmp_path):
  saved = tiny_run.tiny_config(str(tmp_path))
  now = tiny_run.tiny_config(str(tmp_path), **{"model.attention": "chunked",
                                               "train.steps": 99, "opt.lr": 1.0})
  checkpoint.check_compatible(saved, now, "w")  # no error
  deeper = tiny_run.tiny_config(str(tmp_path), **{"model.num_layers": 3,
                                                  "model.position.name": "alibi"})
  with pytest.raises(ValueError, match=r"w holds a checkpoint of a different model "
                     r"\(model.num_layers: 2 saved vs 3 now, model.position.name: 'rope' "
                     r"saved vs 'alibi' now\)"):
    checkpoint.check_compatible(saved, deeper, "w")
  # An approximation of attention is another model, not another kernel.
  for attention in ("linear", "block_sparse"):
    with pytest.raises(ValueError, match=rf"different model \(model.attention: 'softmax' "
                       rf"saved vs '{attention}"):
      checkpoint.check_compatible(saved, tiny_run.tiny_config(
          str(tmp_path), **{"model.attention": attention}), "w")
  chunk = tiny_run.tiny_config(str(tmp_path), **{"model.attention": "block_sparse"})
  with pytest.raises(ValueError, match=r"attention_chunk=\d+' saved vs 'block_sparse with "
                     r"attention_chunk=8' now"):
    checkpoint.check_compatible(chunk, tiny_run.tiny_config(
        str(tmp_path), **{"model.attention": "block_sparse", "model.attention_chunk": 8}), "w")


@pytest.mark.parametrize("key,value", [
    ("data.tokenizer", "sentencepiece"), ("data.vocab_size", 800), ("data.packing", False),
    ("data.name", "python_stdlib"), ("data.seq_len", 64), ("train.batch_size", 4),
    ("train.seed", 1), ("objective.name", "mlm")])
def test_compatibility_refuses_another_data_stream(tmp_path, key, value):
  saved = tiny_run.tiny_config(str(tmp_path))
  with pytest.raises(ValueError, match=rf"w holds a checkpoint of a different data stream "
                                       rf"\({key}: .* saved vs .* now\); its data position"):
    checkpoint.check_compatible(saved, tiny_run.tiny_config(str(tmp_path), **{key: value}), "w")


def test_compatibility_allows_moved_data_and_keys_added_since(tmp_path):
  saved = tiny_run.tiny_config(str(tmp_path))
  checkpoint.check_compatible(saved, tiny_run.tiny_config("/elsewhere"), "w")
  older = tiny_run.tiny_config(str(tmp_path))
  del older.data["tokenizer_train_chars"]  # a checkpoint from before the key existed
  checkpoint.check_compatible(older, tiny_run.tiny_config(str(tmp_path)), "w")
  # A saved config went through JSON, which turns tuples into lists.
  as_json = ml_collections.ConfigDict(json.loads(saved.to_json()))
  assert checkpoint.differences(as_json, saved) == []
  assert checkpoint.differences(as_json, tiny_run.tiny_config(str(tmp_path), **{
      "opt.lr": 0.5})) == [("opt.lr", saved.opt.lr, 0.5)]


def test_single_process_gather_is_the_identity():
  assert checkpoint.gather_host_states({"0": {"a": 1}}) == {"0": {"a": 1}}


def test_load_for_inference_without_a_checkpoint_says_so(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint under"):
    checkpoint.load_for_inference(str(tmp_path))


def test_keep_zero_still_keeps_the_latest_save(tmp_path):
  """keep_checkpoints=0 with keep_best=1: a stop's save (no eval) is what a re-run resumes."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), keep=0, keep_best=1)
  checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config, eval_loss=0.5)
  checkpoint.save(manager, 2, tiny_run.toy_state(2), {}, config)
  checkpoint.finish(manager)
  assert manager.latest_step() == 2 and manager.best_step() == 1
  manager.close()





def test_a_finished_run_rerun_with_other_settings_names_them(tmp_path):
  saved = tiny_run.tiny_config(str(tmp_path), **{"train.init_from": "runs/a"})
  # Where it ran and how it was logged or checkpointed: the same finished run.
  same = tiny_run.tiny_config(str(tmp_path), **{
      "train.init_from": "./runs/a", "train.log_every": 7, "train.keep_checkpoints": 1,
      "mesh.shape": (1, -1, 1), "model.attention": "chunked", "data.data_dir": "/elsewhere",
      "train.profile_steps": "1:2", "train.steps": 2})  # a run stopped early, finished at 2
  checkpoint.check_finished_rerun(saved, same, "w")
  other = tiny_run.tiny_config(str(tmp_path), **{"train.init_from": "runs/a", "opt.lr": 0.5,
                                                  "train.eval_batches": 3})
  with pytest.raises(ValueError, match=r"^w is a finished run of other settings \(opt.lr: 0.01 "
                                       r"saved vs 0.5 now, train.eval_batches: 1 saved vs 3 "
                                       r"now\); use a new --workdir to train with them, or raise "
                                       r"train.steps past 3 to continue"):
    checkpoint.check_finished_rerun(saved, other, "w")
  # A checkpoint from before a key existed: the key is not compared (its default is the old
  # behaviour).
  older = ml_collections.ConfigDict(saved.to_dict())
  del older.opt["lr"], older.train["eval_batches"]
  checkpoint.check_finished_rerun(older, other, "w")


@pytest.mark.slow
def test_a_run_refuses_to_resume_on_a_text_folder_whose_files_changed(tmp_path):
  from transformer.training import loop
  folder = tmp_path / "texts"
  folder.mkdir()
  for i in range(40):
    (folder / f"f{i}.txt").write_text(f"document number {i} says hello to the reader.\n" * 8)
  config = lambda steps: tiny_run.tiny_config(str(tmp_path / "tfds"), **{
      "data.name": "text_folder", "data.path": str(folder), "data.tokenizer": "bytes",
      "train.steps": steps})
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(config(2), workdir)
  manager = checkpoint.make_manager(workdir, 1, 0)
  assert checkpoint.read_meta(manager, 2)["dataset"].startswith("text_folder/texts-")
  (folder / "new.txt").write_text("a file added after the run started\n")
  with pytest.raises(ValueError, match=r"run's step-2 checkpoint was trained on text_folder/"
                                       r"texts-\w+, but these settings build text_folder/texts-"):
    checkpoint.check_dataset(manager, 2, data.built_name(config(4).data), workdir)
  with pytest.raises(ValueError, match=r"trained on text_folder/texts-.*train.init_from="):
    loop.train_and_evaluate(config(4), workdir)
  (folder / "new.txt").unlink()  # the data it trained on: resumes
  assert loop.train_and_evaluate(config(4), workdir)["step"] == 4
  manager.close()


def test_a_background_save_that_ended_is_reported_once_then_recorded(tmp_path):
  """save_ended is what lets the loop stop at the step a background save failed and record its
  sums meanwhile: true once an async save is done and not yet finished, false after `finish`."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), async_save=True)
  assert not checkpoint.save_ended(manager)  # nothing saved yet
  checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config)
  manager.wait_until_finished()
  assert checkpoint.save_ended(manager)
  checkpoint.finish(manager)
  assert not checkpoint.save_ended(manager)
  assert os.path.exists(tmp_path / "checkpoints" / "1" / checkpoint_integrity.SUMS)
  manager.close()


def test_newest_intact_is_the_newest_step_whose_files_match(tmp_path):
  """After a NaN the run is pointed at the newest intact step: not an older one kept beside it,
  and not a newer one damaged since it was saved."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), keep=3, keep_best=0)
  for step in (1, 2, 3):
    checkpoint.save(manager, step, tiny_run.toy_state(step), {}, config)
  checkpoint.finish(manager)
  assert checkpoint.newest_intact(manager) == 3
  flip(str(tmp_path / "checkpoints" / "3"))
  assert checkpoint.newest_intact(manager) == 2
  manager.close()


def test_data_positions_resume_only_into_the_data_they_index(tmp_path):
  """check_dataset refuses other data, and lets through a step saved before the dataset was
  recorded (older checkpoints) or settings that name none."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  manager = checkpoint.make_manager(str(tmp_path), keep=3, keep_best=0)
  checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config)  # no dataset: an older step
  checkpoint.save(manager, 2, tiny_run.toy_state(2), {}, config, dataset="text_folder/a-1")
  checkpoint.finish(manager)
  checkpoint.check_dataset(manager, 1, "text_folder/a-2", "w")
  checkpoint.check_dataset(manager, 2, "text_folder/a-1", "w")
  checkpoint.check_dataset(manager, 2, None, "w")
  with pytest.raises(ValueError, match=r"^w's step-2 checkpoint was trained on text_folder/a-1, "
                                       r"but these settings build text_folder/a-2"):
    checkpoint.check_dataset(manager, 2, "text_folder/a-2", "w")
  manager.close()


def test_close_raises_a_failing_save_unless_another_error_is_on_its_way(tmp_path, monkeypatch):
  """`close` reports a save that failed, except while another error propagates (`failing`),
  where it would only add noise; either way the manager is closed."""
  config = tiny_run.tiny_config(str(tmp_path / "tfds"))
  for failing in (False, True):
    manager = checkpoint.make_manager(str(tmp_path / str(failing)))
    checkpoint.save(manager, 1, tiny_run.toy_state(1), {}, config)
    checkpoint.finish(manager)
    monkeypatch.setattr(manager, "wait_until_finished",
                        lambda: (_ for _ in ()).throw(RuntimeError("the save failed")))
    if failing:
      checkpoint.close(manager, failing=True)
    else:
      with pytest.raises(RuntimeError, match="the save failed"):
        checkpoint.close(manager)
    monkeypatch.undo()
    manager.close()


def test_a_finished_rerun_compares_init_from_paths_as_paths(tmp_path):
  """train.init_from spelled another way ('./runs/a', 'runs/a/') is the same source, whichever
  spelling the saved config has."""
  for saved, now in (("runs/a", "./runs/a"), ("./runs/a", "runs/a"), ("runs/a/", "runs/a")):
    checkpoint.check_finished_rerun(
        tiny_run.tiny_config(str(tmp_path), **{"train.init_from": saved}),
        tiny_run.tiny_config(str(tmp_path), **{"train.init_from": now}), "w")
  with pytest.raises(ValueError, match=r"train.init_from: 'runs/a' saved vs 'runs/b' now"):
    checkpoint.check_finished_rerun(
        tiny_run.tiny_config(str(tmp_path), **{"train.init_from": "runs/a"}),
        tiny_run.tiny_config(str(tmp_path), **{"train.init_from": "runs/b"}), "w")
