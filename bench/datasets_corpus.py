#!/usr/bin/env python3
"""A Parquet text corpus for bench/datasets_prepare: documents of eight fortunes each (the fortunes corpus,
seeded), ~32 MB of text a row group, snappy-compressed as the hub's shards are, with an `id` column beside `text`.

  datasets_corpus.py OUT.parquet MEGABYTES
"""
import pathlib
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

out, megabytes = sys.argv[1], int(sys.argv[2])
docs = []
for f in sorted(pathlib.Path("/usr/share/games/fortunes").iterdir()):
    if f.is_file() and not f.suffix:
        docs += [d.strip() for d in f.read_text(errors="replace").split("\n%\n") if d.strip()]
rng = random.Random(1)
target = megabytes * 1_000_000
writer = None
written = rows = 0
while written < target:
    batch, size = [], 0
    while size < 32_000_000:
        text = "\n\n".join(rng.sample(docs, 8))
        batch.append(text)
        size += len(text.encode())
    table = pa.table({"id": pa.array(range(rows, rows + len(batch)), pa.int64()), "text": batch})
    if writer is None:
        writer = pq.ParquetWriter(out, table.schema, compression="snappy")
    writer.write_table(table, row_group_size=len(batch))
    written += size
    rows += len(batch)
writer.close()
print(f"{out}: {rows} documents, {written} bytes of text, {pq.ParquetFile(out).num_row_groups} row groups")
