"""Reads W&B offline runs back with wandb's own readers, for tests/loggers/wandb_test.cpp and
tests/train/wandb_training_test.sh: the Python one (wandb.sdk.internal.datastore.DataStore, the transaction log reader
of wandb <= 0.29, and wandb_internal_pb2.Record) decodes every record; wandb-core's, the Go reader `wandb sync` uploads
with (`wandb leet inspect FILE`, which prints the records it reads and "# skipped corrupt data" for what it cannot),
must read the same records in the same order. Contacts nothing: WANDB_MODE=offline, and nothing here starts a run.

  wandb_oracle.py dump OFFLINE_RUN_DIR      the run as JSON: header, run, config, environment, history rows, summary,
                                            console lines, preempting, exit (non-finite numbers as "NaN", "Infinity")
  wandb_oracle.py frames FILE...            every record's length and zlib CRC-32 per file, as the reader returns
                                            them (and wandb-core reads as many)
  wandb_oracle.py training RUN_DIR          the offline runs under RUN_DIR/wandb against RUN_DIR/metrics.jsonl
  wandb_oracle.py probe                     exit 0 when the reader is here (77 when not)

Exit 77 (a skip) when this python has no wandb with datastore.py; any reading error fails (exit 1).
"""
import glob
import json
import math
import os
import subprocess
import sys
import zlib

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ["WANDB_DISABLE_CODE"] = "true"
os.environ["WANDB_ERROR_REPORTING"] = "false"

try:
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore
except ImportError as error:
    print(f"SKIP: no wandb with its transaction log reader in {sys.executable} ({error}); scripts/setup installs wandb==0.29.0")
    sys.exit(77)


def records(path):
    """The raw records of a .wandb file, through wandb's DataStore (it asserts on a bad header, checksum or chunk)."""
    store = datastore.DataStore()
    store.open_for_scan(path)
    out = []
    while True:
        data = store.scan_data()
        if data is None:
            return out
        out.append(data)


def core_record_types(path):
    """The record types wandb-core's reader finds in `path`, in order (`wandb leet inspect`, stdout not a terminal)."""
    try:  # the command `wandb leet inspect` runs, without the 2 s of starting the wandb CLI every time
        from wandb.cli import leet
        command = leet._base_args() + ["--inspect"] + leet._get_local_launch_args(leet._resolve_path(path))
    except (ImportError, AttributeError):
        command = [os.path.join(os.path.dirname(sys.executable), "wandb"), "leet", "inspect", path]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=dict(os.environ, WANDB_MODE="offline"))
    assert result.returncode == 0, f"wandb leet inspect {path} exited {result.returncode}: {result.stderr}"
    lines = result.stdout.splitlines()
    corrupt = [line for line in lines if line.startswith("# skipped")]
    assert not corrupt, f"wandb-core could not read all of {path}: {corrupt}"
    return [line.split(": ", 1)[1] for line in lines if line.startswith("# record ")]


def finite(value):
    """JSON for C++'s nlohmann and for comparisons: non-finite floats as the strings W&B's JSON spells."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def item_key(item):
    return "/".join(item.nested_key) if item.nested_key else item.key


def timestamp(ts):
    return ts.seconds + ts.nanos / 1e9


def dump(directory):
    files = glob.glob(os.path.join(directory, "run-*.wandb"))
    assert len(files) == 1, f"{directory} holds {files}"
    run = {"file": os.path.basename(files[0]), "files_dir": os.path.isdir(os.path.join(directory, "files")),
           "history": [], "summary": {}, "output": [], "preempting": False, "exit": None, "config": {},
           "record_types": [], "nums": [], "stream_ids": set()}
    for data in records(files[0]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        run["record_types"].append(kind)
        run["nums"].append(record.num)
        run["stream_ids"].add(record._info.stream_id)
        if kind == "header":
            run["header"] = {"producer": record.header.version_info.producer}
        elif kind == "run":
            r = record.run
            run["run"] = {"run_id": r.run_id, "project": r.project, "entity": r.entity, "display_name": r.display_name,
                          "group": r.run_group, "job_type": r.job_type, "notes": r.notes, "tags": list(r.tags),
                          "host": r.host, "start_time": timestamp(r.start_time)}
            for item in r.config.update:
                run["config"][item_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run["config"][item_key(item)] = json.loads(item.value_json)
        elif kind == "environment":
            e = record.environment
            run["environment"] = {"os": e.os, "host": e.host, "program": e.program, "executable": e.executable,
                                  "root": e.root, "args": list(e.args), "cpu_count": e.cpu_count,
                                  "started_at": timestamp(e.started_at), "slurm": dict(e.slurm)}
        elif kind == "history":
            row = {item_key(item): json.loads(item.value_json) for item in record.history.item}
            assert row.get("_step") == record.history.step.num, f"row {row} has step.num {record.history.step.num}"
            run["history"].append(row)
        elif kind == "summary":
            for item in record.summary.update:
                run["summary"][item_key(item)] = json.loads(item.value_json)
        elif kind == "output_raw":
            run["output"].append(record.output_raw.line)
        elif kind == "preempting":
            run["preempting"] = True
        elif kind == "exit":
            run["exit"] = {"exit_code": record.exit.exit_code, "not_complete": record.exit.not_complete,
                           "runtime": record.exit.runtime}
        else:
            raise AssertionError(f"unexpected record {kind}")
    run["stream_ids"] = sorted(run["stream_ids"])
    core = core_record_types(files[0])
    assert core == run["record_types"], f"wandb-core read {core}, the Python reader {run['record_types']}"
    return finite(run)


def training(run_dir):
    """Every record of metrics.jsonl (the JsonlLogger's) is a row of the W&B run at its step, with equal values; a
    requeued run's attempts share one run id, the last one exits 0, earlier ones are preempted and leave it running."""
    attempts = [dump(d) for d in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*")))]
    assert attempts, f"no offline run under {run_dir}/wandb"
    ids = {a["run"]["run_id"] for a in attempts}
    assert len(ids) == 1, f"attempts with different run ids {ids}"
    for a in attempts[:-1]:
        assert a["preempting"] and a["exit"] == {"exit_code": 75, "not_complete": True, "runtime": a["exit"]["runtime"]}, a["exit"]
    assert attempts[-1]["exit"] is not None and attempts[-1]["exit"]["exit_code"] == 0, attempts[-1]["exit"]
    rows = {}
    for a in attempts:
        for row in a["history"]:
            assert row["_step"] not in rows, f"step {row['_step']} written twice"
            rows[row["_step"]] = row
    steps = sorted(rows)
    compared = 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as metrics:
        for line in metrics:
            record = json.loads(line)
            step = record.pop("step")
            assert step in rows, f"metrics.jsonl's step {step} is not in the W&B history (steps {steps})"
            for key, value in record.items():
                if key in ("examples", "eval_examples"):
                    continue
                name = "eval/" + key[5:] if key.startswith("eval_") else "train/" + key
                assert rows[step][name] == value, f"step {step}: {name} is {rows[step][name]} in W&B, {value} in metrics.jsonl"
                compared += 1
    last = attempts[-1]["summary"]
    for key, value in rows[steps[-1]].items():
        if not key.startswith("_"):
            assert last[key] == value, f"summary {key} = {last[key]}, last row {value}"
    print(f"PASS: {len(attempts)} attempt(s) of run {ids.pop()} in project {attempts[-1]['run']['project']}, {len(rows)} rows (steps {steps[0]}..{steps[-1]}), "
          f"{compared} values equal to metrics.jsonl's; config {sorted(attempts[-1]['config'])}")


if __name__ == "__main__":
    mode, target = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "probe":
        print(f"wandb's reader is here ({datastore.__file__})")
    elif mode == "dump":
        print(json.dumps(dump(target)))
    elif mode == "frames":
        files = []
        for path in sys.argv[2:]:
            frames = [[len(d), zlib.crc32(d)] for d in records(path)]
            core = core_record_types(path)
            assert len(core) == len(frames), f"{path}: wandb-core read {len(core)} records, the Python reader {len(frames)}"
            files.append(frames)
        print(json.dumps(files))
    elif mode == "training":
        training(target)
    else:
        sys.exit(f"unknown mode {mode}")
