"""``pack --from parquet``: rows of tables written by Hugging Face's ``datasets`` and by pyarrow."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import real_media, run_bin

import hframe_cli as h
from hframe_cli.sources import tables
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.tables import TableColumns

CREATED = ["--created", "1700000000"]
HF = ["--column", "image.bytes", "--name-column", "image.path", "--label-column", "label"]
CLASSES = ["cat", "dog", "fish"]


def unique_media(count: int) -> list[Path]:
    """Real images with distinct file names (HF keeps only the base name as the path)."""
    seen: dict[str, Path] = {}
    for p in real_media(200):
        seen.setdefault(p.name, p)
    return list(seen.values())[:count]


@pytest.fixture
def hf_table(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A table as ``datasets`` writes one for the Hub: Image struct with the bytes embedded,
    ClassLabel names in the schema metadata, several row groups."""
    datasets = pytest.importorskip("datasets")
    from datasets.table import embed_table_storage

    images = unique_media(24)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    ds = datasets.Dataset.from_dict(
        {"image": [str(p) for p in images], "label": [i % 3 for i in range(len(images))]}, features=features
    )
    ds = ds.with_format("arrow").map(embed_table_storage, batched=True).with_format(None)
    table = tmp_path / "train-00000-of-00001.parquet"
    ds.to_parquet(str(table), batch_size=8)
    assert pq.ParquetFile(table).metadata.num_row_groups == 3
    return table, images


def test_a_hugging_face_image_table_packs_its_images_names_and_class_names(hf_table, tmp_path):
    table, images = hf_table
    out = tmp_path / "hf.hframe"
    r = run_bin(["pack", "--from", "parquet", str(table), *HF, "-o", str(out), *CREATED])
    assert r.returncode == 0, r.stderr
    got = pq.read_table(f"{out}.index.parquet").to_pylist()
    assert [g["name"] for g in got] == [p.name for p in images]  # table order
    assert [g["md5"] for g in got] == [hashlib.md5(p.read_bytes()).hexdigest() for p in images]
    assert [g["label"] for g in got] == [CLASSES[i % 3] for i in range(len(images))]
    assert [g["source"] for g in got] == [f"{table.name}#row={i}" for i in range(len(images))]
    assert all(g["width"] for g in got if g["media_type"] in ("png", "jpeg"))
    assert run_bin(["verify", str(out)]).returncode == 0
    # an independent reader sees the same
    con = duckdb.connect()
    n, labels = con.execute(
        f"select count(*), count(distinct label) from read_parquet('{out}.index.parquet')"
    ).fetchone()
    assert (n, labels) == (len(images), 3)


def test_rows_without_names_are_named_by_number_and_every_byte_comes_back(tmp_path):
    rng = __import__("random").Random(7)
    blobs = [rng.randbytes(rng.randrange(1, 5000)) for _ in range(50)]
    blobs[10] = None  # a null: left out with a line
    t = pa.table({"data": pa.array(blobs, pa.large_binary()), "tag": [f"t{i % 4}" for i in range(50)]})
    table = tmp_path / "blobs.parquet"
    pq.write_table(t, table, row_group_size=16)
    out = tmp_path / "b.hframe"
    r = run_bin(["pack", "--from", "parquet", str(table), "--column", "data", "--label-column", "tag", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert f"{table}#row=10: no bytes in data (null)" in r.stderr.decode()
    with h.open_pack(out) as p:
        names = p.table.column("name").to_pylist()
        assert names == [f"blobs/{i:09d}" for i in range(50) if i != 10]
        assert p.read_many(list(range(len(p)))) == [b for b in blobs if b is not None]
    labels = pq.read_table(f"{out}.index.parquet", columns=["label"]).column(0).to_pylist()
    assert labels == [f"t{i % 4}" for i in range(50) if i != 10]


def test_a_row_group_is_decoded_once_however_many_threads_ask_for_its_rows(tmp_path, monkeypatch):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"b": [bytes([i]) * (i + 1) for i in range(100)]}), table, row_group_size=25)
    srcs = collect_sources([str(table)], archives="parquet", table_columns=TableColumns("b")).sources
    decoded: list[int] = []
    real = tables._decode
    monkeypatch.setattr(tables, "_decode", lambda r: decoded.append(r.group) or real(r))
    monkeypatch.setattr(tables, "_GROUPS", tables._Groups())
    got: dict[int, bytes] = {}

    def read(part: int) -> None:
        for k in range(part, len(srcs), 2):
            got[k] = tables.read_row(srcs[k].path, srcs[k].size)[0]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[k] for k in range(100)] == [bytes([i]) * (i + 1) for i in range(100)]
    assert sorted(decoded) == [0, 1, 2, 3]


def test_a_killed_pack_of_a_table_resumes_byte_identically_and_a_rewritten_table_is_refused(hf_table, tmp_path):
    table, _ = hf_table
    args = ["--from", "parquet", *HF, *CREATED, "--checkpoint-every", "4"]
    clean, out = tmp_path / "clean.hframe", tmp_path / "k.hframe"
    assert run_bin(["pack", str(table), "-o", str(clean), *args]).returncode == 0
    r = run_bin(["pack", str(table), "-o", str(out), *args], env={"HFRAME_FAULT": "after-frame:13"})
    assert r.returncode < 0, r.stderr
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] > 0
    assert out.read_bytes() == clean.read_bytes()
    again = tmp_path / "again.hframe"
    r = run_bin(["pack", str(table), "-o", str(again), *args], env={"HFRAME_FAULT": "after-frame:13"})
    assert r.returncode < 0
    t = pq.read_table(table)
    pq.write_table(t.slice(0, 20), table, row_group_size=8)  # rewritten: 4 rows fewer
    r = run_bin(["resume", str(again)])
    assert r.returncode == 2 and "inputs changed" in r.stderr.decode(), r.stderr


def test_a_table_rewritten_after_listing_is_never_read_at_a_stale_row(tmp_path):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"b": [b"one", b"two"]}), table)
    srcs = collect_sources([str(table)], archives="parquet", table_columns=TableColumns("b")).sources
    pq.write_table(pa.table({"b": [b"two", b"one"]}), table)
    os.utime(table, ns=(1, 1))
    with pytest.raises(tables.SourceChanged, match="changed since it was listed"):
        tables.read_row(srcs[0].path, srcs[0].size)


def test_what_a_table_cannot_give_is_one_line_and_exit_2(hf_table, tmp_path):
    table, _ = hf_table
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"b": [b"1", b"2"], "n": ["x.bin", "/x.bin"]}), dup)
    for args, words in [
        (["--from", "parquet", str(table), "--column", "image.pixels"], "no such column"),
        (["--from", "parquet", str(table), "--column", "label"], "not binary"),
        (
            ["--from", "parquet", str(table), "--column", "image.bytes", "--label-column", "image"],
            "not text or integers",
        ),
        (["--from", "parquet", str(table)], "needs --column"),
        (["--from", "tar", str(table), "--column", "image.bytes"], "for --from parquet"),
        (["--from", "parquet", str(cut), "--column", "image.bytes"], "not a Parquet table"),
        (["--from", "parquet", str(dup), "--column", "b", "--name-column", "n"], "is given again"),
    ]:
        r = run_bin(["pack", *args, "-o", str(tmp_path / "o.hframe")])
        err = r.stderr.decode()
        assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert not (tmp_path / "o.hframe").exists()
