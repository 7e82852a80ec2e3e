# dump.py SRC_DIR OUT_DIR: each array_record file of a prepared TFDS dataset -> a length-prefixed
# blob of its records in file order (xz them: the records compress ~10x, the files ~2.5x);
# rebuild.py writes them back byte-identical (checked on grammar_corpus large-sentences1-1-maxtokens128).
import os, struct, sys
from array_record.python import array_record_module as ar
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for name in sorted(os.listdir(src)):
  if ".array_record-" not in name:
    continue
  r = ar.ArrayRecordReader(os.path.join(src, name))
  n = r.num_records()
  with open(os.path.join(out, name + ".bin"), "wb") as f:
    f.write(struct.pack("<Q", n))
    for _ in range(n):
      x = r.read()
      f.write(struct.pack("<I", len(x))); f.write(x)
  print(name, n)
