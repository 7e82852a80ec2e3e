"""From a data config and a split name to a random-access dataset of text records.

Built-in datasets (builders.BUILDERS) are generated on first use and reused;
any other name is read as a TFDS catalog dataset that must already be prepared
in array_record format under the data dir (preparing it needs TensorFlow,
which this project does not install).
"""

import functools
import os

import grain
import tensorflow_datasets as tfds

from tensorflow_datasets.core import read_only_builder

from transformer.data import builders

# Fields are (inputs, targets) for seq2seq records; a text record has just ('text',).
SEQ2SEQ_FIELDS = ("inputs", "targets")


def data_dir(data_config) -> str:
  return os.path.expanduser(data_config.data_dir or os.environ.get("TFDS_DATA_DIR")
                            or "~/tensorflow_datasets")


def fields(data_config) -> tuple[str, ...]:
  """('text',) or ('inputs', 'targets'): what each record of this dataset holds."""
  return builders.FIELDS.get(data_config.name, ("text",))


def _no_download():
  # Built-in builders generate locally; this keeps tfds from probing its GCS mirror.
  return {"download_config": tfds.download.DownloadConfig(try_download_gcs=False)}


def _builtin(data_config, split, directory):
  config = builders.BUILDERS[data_config.name].config_from(data_config)
  return tfds.data_source(data_config.name, split=split, data_dir=directory, download=True,
                          builder_kwargs={"config": config, "file_format": "array_record"},
                          download_and_prepare_kwargs=_no_download())


def _catalog_builder(data_config, directory):
  name = data_config.name
  prepare = (f"with TensorFlow installed: tfds build {name.split('/')[0]} --data_dir={directory} "
             f"--file_format=array_record")
  try:
    # From files alone: catalog builder code may import TensorFlow, which we lack.
    builder = read_only_builder.builder_from_files(name, data_dir=directory)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f"unknown dataset {name!r}: built-in datasets are {sorted(builders.BUILDERS)}; a TFDS "
        f"catalog dataset must be prepared first under {directory} ({prepare})") from None
  if builder.info.file_format != tfds.core.FileFormat.ARRAY_RECORD:
    raise ValueError(f"dataset {name!r} under {directory} is {builder.info.file_format.value}, "
                     f"grain needs array_record: rebuild it ({prepare}) or convert it (tfds "
                     f"convert_format --dataset_version_dir={builder.data_dir} "
                     f"--out_file_format=array_record)")
  if data_config.text_key not in builder.info.features:
    raise ValueError(f"dataset {name!r} has no feature data.text_key={data_config.text_key!r}; "
                     f"features: {sorted(builder.info.features)}")
  return builder


def _check_nonempty(source, name, split):
  # An empty split (e.g. a small text_folder's 5% test bucket) would make iterators hang.
  if len(source) == 0:
    raise ValueError(f"split {split!r} of dataset {name!r} is empty")


def _decode(record, text_key):
  # Text features arrive as bytes; other features (a file's 'path') ride along.
  decoded = {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in record.items()}
  if text_key != "text":
    decoded["text"] = decoded.pop(text_key)
  return decoded


def load(data_config, split: str) -> grain.MapDataset:
  """Records of `split` as dicts with str values for `fields(data_config)`."""
  directory = data_dir(data_config)
  if data_config.name in builders.BUILDERS:
    source, text_key = _builtin(data_config, split, directory), "text"
  else:
    source = _catalog_builder(data_config, directory).as_data_source(split=split)
    text_key = data_config.text_key
  _check_nonempty(source, data_config.name, split)
  return grain.MapDataset.source(source).map(functools.partial(_decode, text_key=text_key))


def check(data_config) -> None:
  """Raises a one-line ValueError for an unknown name or bad knob, building nothing."""
  if data_config.name in builders.BUILDERS:
    builders.BUILDERS[data_config.name].config_from(data_config)
  else:
    _catalog_builder(data_config, data_dir(data_config))


def describe(data_config) -> str:
  """The dataset's description (python_stdlib: Python version and content hash)."""
  if data_config.name not in builders.BUILDERS:
    return _catalog_builder(data_config, data_dir(data_config)).info.description
  cls = builders.BUILDERS[data_config.name]
  return cls(data_dir=data_dir(data_config), config=cls.config_from(data_config)).info.description


def record_texts(record: dict[str, str]) -> list[str]:
  """The text pieces of a record, for tokenizer training and statistics."""
  return [record[k] for k in SEQ2SEQ_FIELDS] if "inputs" in record else [record["text"]]
