"""A Hugging Face folder edited in place, as another writer would have left it."""

import json
import os

from safetensors.numpy import load_file, save_file


def edit(path, config=None, tensors=None):
  """Apply `config` to the folder's parsed config.json and `tensors` to its
  model.safetensors (each a function that changes its dict in place), and write them back."""
  if config:
    with open(os.path.join(path, "config.json")) as f:
      written = json.load(f)
    config(written)
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(written, f)
  if tensors:
    t = load_file(os.path.join(path, "model.safetensors"))
    tensors(t)
    save_file(t, os.path.join(path, "model.safetensors"))
