"""``tables.compact_runs`` and ``autoprofiler compact``: fewer parts, the same rows in the same order."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from autoprofiler.cli import main
from autoprofiler.tables import CANDIDATE_SCHEMA, ParquetTable, compact_runs, part_files

ROOT = Path(__file__).resolve().parents[1]


def _write(directory, run_id, rows):
    """One part per row (flush_every=1), under ``run=<run_id>``; a key already held is written again."""
    table = ParquetTable(
        directory, CANDIDATE_SCHEMA, flush_every=1, run_id=run_id, writer="arrow", keep="last"
    )
    for key, source in rows:
        table.append({"key": key, "task_hash": "t", "source": source})
        time.sleep(0.002)  # part names carry the time to the microsecond; keep them distinct


def _view(directory, keep):
    return [(r["key"], r["source"]) for r in ParquetTable(directory, CANDIDATE_SCHEMA, keep=keep).records()]


def _all_rows(directory):
    return sum(pq.ParquetFile(p).metadata.num_rows for p in part_files(directory))


def test_compaction_keeps_every_row_and_what_readers_see(tmp_path):
    d = tmp_path / "candidates"
    _write(d, "a", [("k1", "a1"), ("k2", "a2"), ("k3", "a3")])
    _write(d, "b", [("k2", "b2"), ("k4", "b4")])  # k2 measured again in run b
    _write(d, "c", [("k5", "c5")])
    first, last, rows = _view(d, "first"), _view(d, "last"), _all_rows(d)
    assert len(part_files(d)) == 6

    done = compact_runs(d, "candidate")

    assert (done.parts_before, done.parts_after, done.skipped) == (6, 3, ())
    assert len(part_files(d)) == 3 and _all_rows(d) == rows == 6  # the duplicate of k2 is still there
    assert _view(d, "first") == first and ("k2", "a2") in first
    assert _view(d, "last") == last and ("k2", "b2") in last
    assert compact_runs(d, "candidate").parts_after == 3  # a second pass changes nothing


def test_a_merged_part_that_does_not_read_back_whole_replaces_nothing(tmp_path, monkeypatch):
    d = tmp_path / "candidates"
    _write(d, "a", [("k1", "a1"), ("k2", "a2")])
    parts = part_files(d)
    write = pq.write_table
    monkeypatch.setattr(pq, "write_table", lambda table, where: write(table.slice(0, 1), where))

    done = compact_runs(d, "candidate")

    assert done.skipped == ("run=a: the merged part did not read back with its 2 rows",)
    assert part_files(d) == parts and not list(d.glob("run=a/.*"))  # the old parts, no temporary left
    assert _view(d, "first") == [("k1", "a1"), ("k2", "a2")]


def test_a_compaction_stopped_half_way_is_mended_by_the_next(tmp_path):
    """Stopped after renaming the merged part over the first and before removing the others: the rows
    of the others are held twice; readers see the same, and the next compaction drops the copies."""
    d = tmp_path / "candidates"
    _write(d, "a", [("k1", "a1"), ("k2", "a2"), ("k3", "a3")])
    first, last = _view(d, "first"), _view(d, "last")
    parts = part_files(d)
    merged = pa.concat_tables([pq.read_table(p) for p in parts])
    pq.write_table(merged, parts[0])  # the merged part renamed over the first; the others still there
    assert _all_rows(d) == 5 and _view(d, "first") == first and _view(d, "last") == last

    done = compact_runs(d, "candidate")

    assert done.copies_dropped == 2 and done.parts_after == 1 and _all_rows(d) == 3
    assert _view(d, "first") == first and _view(d, "last") == last


def test_runs_whose_parts_interleave_are_left_as_they_were(tmp_path):
    d = tmp_path / "candidates"
    a = ParquetTable(d, CANDIDATE_SCHEMA, flush_every=1, run_id="a", writer="arrow", keep="last")
    b = ParquetTable(d, CANDIDATE_SCHEMA, flush_every=1, run_id="b", writer="arrow", keep="last")
    for i, table in enumerate([a, b, a]):  # two runs writing at once
        table.append({"key": "k", "task_hash": "t", "source": f"{table.run_id}{i}"})
        time.sleep(0.002)
    _write(d, "c", [("k9", "c1"), ("k10", "c2")])
    first, last = _view(d, "first"), _view(d, "last")

    done = compact_runs(d, "candidate")

    assert sorted(s.split(":")[0] for s in done.skipped) == ["run=a", "run=b"]
    assert done.parts_after == 4  # a and b untouched (2 + 1), c merged (1)
    assert _view(d, "first") == first == [("k", "a0"), ("k9", "c1"), ("k10", "c2")]
    assert _view(d, "last") == last == [("k", "a2"), ("k9", "c1"), ("k10", "c2")]  # merging a would give b1


def test_compact_command_rewrites_a_recording_and_refuses_a_folder_that_is_not_one(tmp_path, capsys):
    _write(tmp_path / "rec" / "candidates", "a", [("k1", "x"), ("k2", "y")])
    assert main(["compact", str(tmp_path / "nothing"), str(tmp_path / "rec")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing is not a recording" in err
    assert len(part_files(tmp_path / "rec" / "candidates")) == 2  # nothing rewritten before the check

    assert main(["compact", str(tmp_path / "rec")]) == 0
    assert "candidates: 2 -> 1 parts" in capsys.readouterr().out
    assert _view(tmp_path / "rec" / "candidates", "first") == [("k1", "x"), ("k2", "y")]


def test_a_device_call_packs_its_recording_compacted(tmp_path):
    """``compact_and_finish`` (``bench/lib_pack.sh``): the tarball a call brings back has one part per run."""
    rec = tmp_path / "rec"
    _write(rec / "candidates", "a", [("k1", "a1"), ("k2", "a2")])
    _write(rec / "candidates", "b", [("k2", "b2"), ("k3", "b3")])
    first = _view(rec / "candidates", "first")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "PACK_EVERY": "600"}
    script = f"source bench/lib_pack.sh; start_packing {tmp_path}/rec.tgz {rec}; compact_and_finish {rec}"
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "compact: " in done.stdout and "candidates: 4 -> 2 parts" in done.stdout
    out = tmp_path / "unpacked"
    with tarfile.open(tmp_path / "rec.tgz") as tar:
        tar.extractall(out, filter="data")
    unpacked = out / str(rec).lstrip("/") / "candidates"
    assert len(part_files(unpacked)) == 2
    assert _view(unpacked, "first") == first and _all_rows(unpacked) == 4


def test_unpacking_a_compacted_call_replaces_the_tables_it_holds(tmp_path):
    """``bench/unpack_recording.sh``: where this tree holds a run uncompacted (a call stopped before it
    compacted) and the next call brings that run back compacted, untarring over the tree would leave the
    old parts beside the merged one (each row twice); the script replaces the table folders instead."""
    here = tmp_path / "here" / "rec"
    _write(here / "candidates", "a", [("k1", "a1"), ("k2", "a2"), ("k3", "a3")])
    device = tmp_path / "device" / "rec"
    shutil.copytree(here, device)
    _write(device / "candidates", "b", [("k4", "b4")])  # the call's new rows
    compact_runs(device / "candidates", "candidate")
    (device / "logs").mkdir()
    (device / "logs" / "call.log").write_text("done\n")
    with tarfile.open(tmp_path / "rec.tgz", "w:gz") as tar:
        tar.add(device, arcname="rec")
    script = ROOT / "bench" / "unpack_recording.sh"

    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "rec.tgz")], cwd=here.parent, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr
    assert len(part_files(here / "candidates")) == 2 and _all_rows(here / "candidates") == 4
    assert _view(here / "candidates", "first") == [("k1", "a1"), ("k2", "a2"), ("k3", "a3"), ("k4", "b4")]
    assert (here / "logs" / "call.log").read_text() == "done\n"
    bad = subprocess.run(["bash", str(script), str(tmp_path / "none.tgz")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "none.tgz is not a file" in bad.stderr
    with tarfile.open(tmp_path / "logs.tgz", "w:gz") as tar:  # a tarball of no recording: nothing unpacked
        tar.add(device / "logs", arcname="elsewhere")
    bad = subprocess.run(
        ["bash", str(script), str(tmp_path / "logs.tgz")], cwd=tmp_path, capture_output=True, text=True
    )
    assert (
        bad.returncode == 2
        and "holds no recording table" in bad.stderr
        and not (tmp_path / "elsewhere").exists()
    )


def test_drop_reward_rows_drops_only_the_rows_of_the_given_kind(tmp_path):
    """``bench/drop_reward_rows.py --error-kind crashed``: of three rows whose error holds the text, only
    the ``crashed`` one goes (a caught ``runtime_error`` with the same text and a clean row stay); a part
    left empty is removed; ``--dry-run`` changes nothing."""
    oom = "12.52 GiB allowed; Of the allocated memory 12.30 GiB is allocated by PyTorch"
    rows = {
        "key": ["k1", "k2", "k3", "k4"],
        "action": ["cuda_graph", "cuda_graph", "keep", "tf32"],
        "error_kind": ["crashed", "runtime_error", None, "crashed"],
        "error": [f"died (exit code 1; {oom})", f"timing: {oom}", None, f"died ({oom})"],
        "run_id": ["r1", "r1", "r1", "r2"],
    }
    table = pa.table(rows)
    (tmp_path / "run=r1").mkdir()
    (tmp_path / "run=r2").mkdir()
    pq.write_table(table.slice(0, 3), tmp_path / "run=r1" / "part-0.parquet")
    pq.write_table(table.slice(3, 1), tmp_path / "run=r2" / "part-0.parquet")
    script = [sys.executable, str(ROOT / "bench" / "drop_reward_rows.py"), str(tmp_path)]
    flags = ["--error-contains", "allowed; Of the allocated", "--error-kind", "crashed"]

    dry = subprocess.run([*script, *flags, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "2 dropped, 2 kept" in dry.stdout, dry.stdout + dry.stderr
    assert len(part_files(tmp_path)) == 2
    done = subprocess.run([*script, *flags], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0 and "r1  cuda_graph: 1 row(s) dropped" in done.stdout, done.stdout
    left = pq.read_table(tmp_path / "run=r1" / "part-0.parquet")
    assert left["key"].to_pylist() == ["k2", "k3"]
    assert not (tmp_path / "run=r2" / "part-0.parquet").exists()  # its one row went
