"""Hugging Face datasets on disk, written by `datasets` and pyarrow themselves (the oracle of tests/datasets and
tests/lm/sft_datasets_test.sh); hpctrain never writes them.

  datasets_fixtures.py make OUT [SOURCE.jsonl]
      The rows of SOURCE.jsonl (default: 40 conversations of their own, with system prompts, tool calls and tools,
      and an int, a float, a bool and a nullable column beside them) as
        OUT/hub/data/train-0000{0,1}-of-00002.parquet, OUT/hub/data/test-00000-of-00001.parquet
            a hub download's layout: the rows split 3:1 into train and test, train in two shards, each written
            with row groups of 7 rows (several a file);
        OUT/hub/README.md, OUT/hub/.cache/ignored.parquet   what a download holds beside (no data; hidden);
        OUT/saved/      `Dataset.save_to_disk` of the train split (Arrow stream files and state.json);
        OUT/export.jsonl   the train split as `Dataset.to_json` exports it;
        OUT/expected.jsonl the train split's rows as `datasets.load_dataset(OUT/hub, split="train")` gives them,
                           one json.dumps each (key order = the features');
        OUT/bad/           files hpctrain must refuse: messages.parquet (messages a string column),
                           stamped.parquet (a timestamp column "text"), unassisted.parquet (row 9 — row group 1,
                           its row 2 — without an assistant turn).
"""
import json
import os
import pathlib
import sys


def own_rows():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    rows = []
    for i in range(40):
        messages = [{"role": "user", "content": f"Question {i}: how warm is it in Oslo, « {i * 3} »?"}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Be brief. ünïcödé"})
        if i % 4 == 1:
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]})
            messages.append({"role": "tool", "content": f"{i} °C"})
        messages.append({"role": "assistant", "content": f"Answer {i * 7}."})
        rows.append({"id": i, "messages": messages, "tools": tools if i % 4 == 1 else None,
                     "score": i / 8 + 0.1, "kept": i % 2 == 0, "note": None if i % 5 else f"note {i}"})
    return rows


def make(out, source):
    os.environ.setdefault("HF_HOME", str(out / "hf-home"))
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets
    import pyarrow.parquet as pq
    datasets.disable_progress_bars()
    if source:
        rows = [json.loads(line) for line in open(source, encoding="utf-8") if line.strip()]
    else:
        rows = own_rows()
    whole = datasets.Dataset.from_list(rows)
    cut = len(rows) * 3 // 4
    train, test = whole.select(range(cut)), whole.select(range(cut, len(rows)))
    data = out / "hub" / "data"
    data.mkdir(parents=True)
    halves = [train.shard(2, k, contiguous=True) for k in range(2)]
    for name, part in [("train-00000-of-00002", halves[0]), ("train-00001-of-00002", halves[1]),
                       ("test-00000-of-00001", test)]:
        # The table with its schema metadata (the features), row groups of 7 rows.
        pq.write_table(part.with_format("arrow")[:], data / f"{name}.parquet", row_group_size=7)
    (out / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")
    (out / "hub" / ".cache").mkdir()
    pq.write_table(test.with_format("arrow")[:], out / "hub" / ".cache" / "ignored.parquet")
    train.save_to_disk(str(out / "saved"), num_shards=2)
    train.to_json(str(out / "export.jsonl"), lines=True, force_ascii=False)
    import datetime
    import pyarrow as pa
    bad = out / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"messages": ["[]"] * 3}), bad / "messages.parquet")
    pq.write_table(pa.table({"text": [datetime.datetime(2026, 1, 1)] * 3}), bad / "stamped.parquet")
    unassisted = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
                  for i in range(12)]
    unassisted[9]["messages"].pop()
    pq.write_table(pa.Table.from_pylist(unassisted), bad / "unassisted.parquet", row_group_size=7)
    loaded = datasets.load_dataset(str(out / "hub"), split="train")
    with open(out / "expected.jsonl", "w", encoding="utf-8") as expected:
        for row in loaded:
            expected.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(loaded)} train rows; {len(list(data.iterdir()))} Parquet files; "
          f"{len(list((out / 'saved').glob('*.arrow')))} Arrow files saved")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(pathlib.Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
