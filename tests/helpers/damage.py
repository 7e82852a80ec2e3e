"""Damage done to a saved checkpoint step, as a disk or a stray command would do it."""

import os


def biggest(folder):
  files = [os.path.join(p, n) for p, _, names in os.walk(folder) for n in names]
  return max(files, key=os.path.getsize)


def flip(step_dir, offset=5000):
  """Flip the bits of one byte of the step's largest parameter file."""
  path = biggest(os.path.join(step_dir, "params"))
  offset = min(offset, os.path.getsize(path) - 1)
  with open(path, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0xFF]))
