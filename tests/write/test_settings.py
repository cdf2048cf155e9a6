"""One settings value down the pack path, and one owner for each output's lock."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections import Counter

import pytest

import hframe_cli as h
from hframe_cli.errors import PackLocked
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.media import MediaOptions
from hframe_cli.write import lock as lock_module
from hframe_cli.write.checkpoint import load_checkpoint
from hframe_cli.write.lock import OutputLock
from hframe_cli.write.run import write_pack
from hframe_cli.write.settings import RECORDED, PackSettings


@pytest.fixture
def acquired(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every lock taken, by the output it guards (file name only)."""
    taken: Counter[str] = Counter()
    real = OutputLock.acquire

    def counting(self: OutputLock, *args: object, **kw: object) -> OutputLock:
        taken[os.path.basename(self.output)] += 1
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(OutputLock, "acquire", counting)
    return taken


def test_every_output_is_locked_once_per_run_by_the_layer_that_writes_it(photos, tmp_path, acquired):
    """The front door takes a run's lock once and passes it down; a shard's driver takes that
    shard's. Before, one sharded run took the dataset's lock three times (re-entrantly)."""
    ds = tmp_path / "ds.hframe"
    outcome = h.pack([str(photos)], ds, max_pack_bytes=15_000, created_us=1)
    assert outcome.mode == "sharded" and len(outcome.results) >= 2
    shards = [os.path.basename(r.path) for r in outcome.results]
    assert acquired == Counter({"ds.hframe": 1, **dict.fromkeys(shards, 1)})

    acquired.clear()
    one = tmp_path / "one.hframe"
    h.pack([str(photos)], one, created_us=1)
    (photos / "zz-new.bin").write_bytes(b"appended")
    assert h.pack([str(photos)], one, update=True).plan.status == "append"
    assert acquired == Counter({"one.hframe": 2})  # once per run

    acquired.clear()
    h.pack([str(photos)], tmp_path / "parts.hframe", shard_of="1/2", created_us=1)
    h.resume_pack(ds)  # a complete dataset: nothing to do
    assert acquired == Counter({"parts-00001.hframe": 1, "ds.hframe": 1})


def test_a_layer_below_the_front_door_refuses_to_write_without_the_outputs_lock(photos, tmp_path):
    srcs = collect_sources([str(photos)])
    out, other = tmp_path / "p.hframe", tmp_path / "q.hframe"
    with OutputLock(other) as held, pytest.raises(RuntimeError, match="without holding its lock"):
        write_pack(srcs, os.fspath(out), PackSettings(), lock=held)
    with pytest.raises(RuntimeError, match="without holding its lock"):
        write_pack(srcs, os.fspath(out), PackSettings(), lock=OutputLock(out))  # not taken
    assert list(tmp_path.iterdir()) == [photos]  # nothing written, no lock file left


def test_a_lock_this_thread_holds_is_never_taken_again_and_another_thread_is_refused(tmp_path):
    out = tmp_path / "p.hframe"
    refused: list[BaseException] = []
    with OutputLock(out):
        with pytest.raises(RuntimeError, match="already held by this thread"):
            OutputLock(out).acquire()
        worker = threading.Thread(target=lambda: refused.append(pytest.raises(PackLocked, OutputLock(out).acquire)))
        worker.start()
        worker.join()
        assert os.path.exists(f"{out}.lock")
    assert not os.path.exists(f"{out}.lock") and not lock_module._HELD


def test_settings_are_frozen_and_what_a_checkpoint_records_comes_back_whole():
    settings = PackSettings(
        alignment=64,
        created_us=5,
        skip_bad=True,
        self_check_frames=7,
        media=MediaOptions(compress="zstd:5", video_frames="keyframes"),
        workers=3,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.alignment = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.media.compress = "none"  # type: ignore[misc]
    doc = json.loads(json.dumps(settings.to_dict()))
    assert sorted(doc) == sorted(RECORDED)
    here = PackSettings(workers=1, handle_signals=True)
    assert here.restored(doc) == dataclasses.replace(settings, workers=1, handle_signals=True)
    # a plan an earlier version wrote: "force" beside the settings, no self_check_frames
    old = {"alignment": 16, "created_us": 9, "force": True, "skip_bad": False, "media": {"compress": "none"}}
    assert here.restored(old) == PackSettings(alignment=16, created_us=9, workers=1, handle_signals=True)


def test_a_checkpoint_keeps_the_runs_settings_as_to_dict_writes_them(photos, tmp_path):
    """The intent a run records before its first frame (what resume reads back)."""
    out = tmp_path / "p.hframe"
    seen: dict[str, object] = {}

    def look(sealed: object) -> None:  # the checkpoint is still on disk while the pack is sealed
        seen.update(load_checkpoint(out)[0].options)

    media = MediaOptions(image_meta=False)
    h.pack_sources(collect_sources([str(photos)]), out, alignment=32, created_us=7, media=media, after_seal=look)
    want = PackSettings(alignment=32, created_us=7, media=media).to_dict()
    assert {k: seen[k] for k in RECORDED} == want and set(seen) == {*RECORDED, "pack_uuid", "collect"}
