# rebuild.py BLOB_DIR OUT_DIR: the blobs back into array_record files (one record per group, zstd).
import os, struct, sys
from array_record.python import array_record_module as ar
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for name in sorted(os.listdir(src)):
  if not name.endswith(".bin"):
    continue
  with open(os.path.join(src, name), "rb") as f:
    data = f.read()
  (n,) = struct.unpack_from("<Q", data, 0); pos = 8
  w = ar.ArrayRecordWriter(os.path.join(out, name[:-4]), "group_size:1")
  for _ in range(n):
    (k,) = struct.unpack_from("<I", data, pos); pos += 4
    w.write(data[pos:pos + k]); pos += k
  w.close()
  print(name[:-4], n)
