"""log.wandb: a real offline W&B run directory is written; its history, read back from the run's own
file, holds the scalars of metrics.jsonl, and its samples table the rows of samples.jsonl."""
import glob
import json
import os
import struct
import sys
import time

import pytest

from test_trainer import read_jsonl, small_config

wandb = pytest.importorskip("wandb")


def wandb_records(path: str, block: int = 32768):
    """The protobuf records of a run's `.wandb` file: a 7-byte header (":W&B", magic, version), then a
    log of 32 KiB blocks, each record a (crc32, length, type) header and a payload that may span blocks
    (type 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    if not data:  # not written yet
        return
    assert data[:4] == b":W&B"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + n > len(data):  # the end, or a record still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            yield record


def complete_records(run_file: str, timeout_s: float = 120.0) -> list:
    """The run file's records once it holds the run's `exit` record. `run.finish()` can return before the
    wandb service has flushed its buffered writer (seen on a loaded CI host: a run file without its history
    records), so a reader waits for the record that closes the run instead of reading whatever is on disk."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = list(wandb_records(run_file))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def history(run_file: str) -> list[dict]:
    rows = []
    for r in complete_records(run_file):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def test_an_offline_run_holds_the_scalars_and_the_samples(tmp_path, monkeypatch):
    from jaxrl_llm.trainer import Trainer
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    c = small_config(**{"log.wandb": True, "log.wandb_project": "tests", "log.wandb_name": "tiny",
                        "log.num_samples": 3})
    Trainer(c, str(tmp_path)).run()
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1
    rows = {r["_step"]: r for r in history(runs[0])}
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert sorted(rows) == [m["step"] for m in logged] == [1, 2]
    for m in logged:
        for k in ("reward/mean", "policy/loss", "response_length/mean", "kl/ref"):
            assert rows[m["step"]][k] == pytest.approx(m[k], rel=1e-6), k
    # The samples table of step 2: a table file with the rows of samples.jsonl.
    table = rows[2]["samples/path"]
    content = json.loads(open(os.path.join(os.path.dirname(runs[0]), "files", table)).read())
    expect = [s for s in read_jsonl(tmp_path / "samples.jsonl") if s["step"] == 2]
    assert content["columns"][:5] == ["step", "prompt", "completion", "reference", "reward"]
    assert [r[1:3] for r in content["data"]] == [[s["prompt"], s["completion"]] for s in expect]
    assert [r[4] for r in content["data"]] == pytest.approx([s["reward"] for s in expect])
    assert (tmp_path / "wandb_id").read_text().strip() in runs[0]


def test_without_wandb_a_one_line_error(monkeypatch):
    from jaxrl_llm.wandb_log import import_wandb
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ImportError, match=r"^log\.wandb=True needs the wandb package: pip install wandb"):
        import_wandb()
