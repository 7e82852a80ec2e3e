"""Experiment configs: each dataset a config's docstring offers fits its settings as written."""

import random

import pytest

from transformer import data
from transformer.data import algorithmic, kv_retrieval

from configs import seq2seq

# Every dataset pairing the seq2seq docstring advertises.
SEQ2SEQ_ARGS = [f"size=xs,task={task}" for task in data.TASKS] + ["size=xs,dataset=kv_retrieval"]


@pytest.mark.parametrize("arg", SEQ2SEQ_ARGS)
def test_seq2seq_config_fits_every_dataset_it_offers(tmp_path, arg):
  # Seq2seq examples are never truncated: a seq_len shorter than the longest example is an
  # error at the first batch, so the config's seq_len must hold its dataset's examples.
  config = seq2seq.get_config(arg)
  config.data.update(data_dir=str(tmp_path), size="tiny")  # tiny: same lengths, fewer records
  tokenizer = data.get_tokenizer(config.data)
  assert tokenizer.vocab_size <= config.model.vocab_size
  assert config.data.seq_len <= config.model.max_len
  splits = ("train", "validation") + (("test_long",) if "task" in arg else ())
  for split in splits:
    batch = next(data.make_iterator(config.data, tokenizer, split=split, batch_size=4,
                                    objective=config.objective.name, seed=0))
    assert batch["decoder_weights"].sum() > 0


@pytest.mark.parametrize("task", sorted(data.TASKS))
def test_longest_example_bound_is_tight(task):
  rng = random.Random(0)
  lengths = [max(map(len, algorithmic.example(task, rng, 5, 5))) for _ in range(50)]
  assert max(lengths) == algorithmic.max_chars(task, 5)
  for pairs in (1, 16, 300):
    inputs, _ = kv_retrieval.item(rng, pairs)
    assert len(inputs) == kv_retrieval.max_chars(pairs)


def test_a_seq2seq_split_longer_than_seq_len_is_refused_before_training():
  config = seq2seq.get_config("size=xs,task=addition")
  config.data.seq_len = 64
  data.validate(config.data, "seq2seq", splits=("train", "validation"))  # 34 tokens: fits
  with pytest.raises(ValueError, match="split 'test_long' of 'algorithmic' has examples of 66 "
                                       "tokens but data.seq_len=64; raise data.seq_len to at "
                                       "least 66"):
    data.validate(config.data, "seq2seq", splits=("train", "test_long"))


def test_finetune_config_takes_the_model_data_and_batch_but_not_the_mesh(tmp_path):
  """configs/finetune.py copies what decides the model and its data stream, not where or how
  the source trained (its mesh could need more devices than the fine-tuning machine has)."""
  import json
  from configs import finetune
  from transformer import schema
  source = schema.experiment_config(schema.model_config(kind="decoder", num_layers=3),
                                    data.default_config(), schema.objective_config("lm"))
  source.data.seq_len, source.train.batch_size, source.train.steps = 64, 12, 5000
  source.mesh.shape, source.opt.lr = (4, 1, 2), 3.0
  (tmp_path / "config.json").write_text(json.dumps(source.to_dict()))
  got = finetune.get_config(f"from={tmp_path},steps=10")
  assert got.model.num_layers == 3 and got.data.seq_len == 64 and got.train.batch_size == 12
  assert got.objective.name == "lm" and got.train.init_from == str(tmp_path)
  fresh = schema.experiment_config(schema.model_config(), data.default_config(),
                                   schema.objective_config("lm"))
  assert tuple(got.mesh.shape) == tuple(fresh.mesh.shape)
  assert got.train.steps == 10 and got.opt.lr == 1e-4
  # An earlier step of the source, as the README's WORKDIR[:STEP] says.
  got = finetune.get_config(f"from={tmp_path}:400")
  assert got.train.init_from == f"{tmp_path}:400" and got.model.num_layers == 3


def test_finetune_from_a_hugging_face_or_corrupt_directory_is_one_line(tmp_path):
  from configs import finetune
  (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
  with pytest.raises(ValueError, match=r"is a Hugging Face checkpoint \(model_type 'llama'\), "
                                       r"not a run directory; convert it first: python -m "
                                       rf"transformer.convert --from_hf {tmp_path} --to WORKDIR"):
    finetune.get_config(f"from={tmp_path}")
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=rf"{tmp_path}/config.json is not valid JSON"):
    finetune.get_config(f"from={tmp_path}")


# Published architectures: the arch file against what the HF converter derives from the
# published config (transformers' defaults are these checkpoints' configs).
ARCH_VS_HF = {
    "gpt2_small": ("gpt2", "GPT2Config", {}),
    "bert_base": ("bert", "BertConfig", {}),
    "t5_small": ("t5", "T5Config", dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6,
                                         num_heads=8, vocab_size=32128)),
}


@pytest.mark.parametrize("arch", sorted(ARCH_VS_HF))
def test_arch_configs_match_the_converted_published_configs(arch):
  transformers = pytest.importorskip("transformers")
  import importlib
  from transformer.interop.hf_families import FAMILIES
  family, cls, kwargs = ARCH_VS_HF[arch]
  ours = importlib.import_module(f"configs.arch.{arch}").get_config().model.to_dict()
  published = getattr(transformers, cls)(**kwargs).to_dict()
  converted = FAMILIES[family].config(published, set(), lambda *_: True).to_dict()
  ours.pop("num_encoder_layers"), ours.pop("num_decoder_layers")  # 0: num_layers, written out
  assert {k: (v, converted[k]) for k, v in ours.items()
          if k in converted and v != converted[k] and k not in ("dtype", "param_dtype",
                                                                 "scan_layers")} == {}
