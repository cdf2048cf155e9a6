#!/usr/bin/env bash
# The main job end to end on a generated sample: make images → pack → check → inspect → read.
# Creates ./.venv on first use; works offline once dependencies are installed. Output: ./sample/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
rm -rf sample && mkdir sample
step() { printf '\n\033[1m$ %s\033[0m\n' "$*" >&2; "$@"; }

step python scripts/make_sample.py sample/photos --count 60 --clips 3 --records 300
step hframe pack sample/photos -o sample/photos.hframe
find sample/photos -name '*.jpg' | step hframe pack - -o sample/jpegs.hframe --base sample/photos --align 4096 --json
step hframe verify sample/photos.hframe
step hframe verify sample/photos.hframe --sample 25% --seed 7 --decode
cp sample/photos.hframe sample/damaged.hframe && cp sample/photos.hframe.index.parquet sample/damaged.hframe.index.parquet
printf '\x00\x00' | dd of=sample/damaged.hframe bs=1 seek=5000 conv=notrunc status=none
echo "(flipped 2 bytes at offset 5000 of a copy; verify must name the frame and exit 1)" >&2
set +e; step hframe verify sample/photos.hframe sample/damaged.hframe --html sample/verify.html; rc=$?; set -e
[[ $rc == 1 ]] || { echo "expected exit 1 from verify, got $rc" >&2; exit 1; }
echo "(the same report as a page: open sample/verify.html)" >&2
step hframe dump-header sample/photos.hframe
step hframe dump-header sample/photos.hframe --frame 0 --bytes 16
step hframe index sample/photos.hframe --columns frame_id,name,offset,length,md5,media_type,label --match 'cats/*'
step hframe get sample/photos.hframe cats/000.png -o sample/cats-000.png
step cmp sample/cats-000.png sample/photos/cats/000.png
echo "get: bytes identical to the source" >&2
# the index alone is enough to read a frame with plain tools: offset and length, then dd
read -r off len < <(hframe index sample/photos.hframe -c offset,length --match cats/001.jpg --no-header)
dd if=sample/photos.hframe bs=1 skip="$off" count="$len" status=none | cmp - sample/photos/cats/001.jpg
echo "dd at the indexed offset: bytes identical to the source" >&2
rm sample/photos.hframe.index.parquet
step hframe index sample/photos.hframe --rebuild
step hframe bench-cold sample/photos.hframe --frames 16 --batches 5 --seed 1 --compare sample/photos --md5 --plot sample/bench-cold.png
step hframe bench-warm sample/photos.hframe --frames 16 --batches 5 --seed 1 --sampler block-local --block-size 20
step python -c "import hframe_cli as h; p = h.open_pack('sample/photos.hframe'); print(len(p), 'frames;', 'read_many of 8:', [len(b) for b in p.read_many(range(8))])"
# training: a DataLoader over the pack (only where torch is installed: pip install 'hframe[torch]')
if python -c "import torch" 2>/dev/null; then
    step python -W ignore -c "
from torch.utils.data import DataLoader
from hframe_cli.training import FrameDataset
ds = FrameDataset('sample/photos.hframe', decode='pil', transform=lambda im: im.size)
sizes, labels = next(iter(DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)))
print(len(ds), 'frames,', 'classes', ds.classes, '; a batch of labels:', labels.tolist())"
else
    echo "(torch not installed: skipping the DataLoader step)" >&2
fi
# media: videos cut into frames, per-frame zstd with a trained dictionary, hashed splits
step hframe pack sample/clips -o sample/clips.hframe --video-frames fps:2 --frame-format jpeg:90 --split train=0.8,val=0.2
step hframe index sample/clips.hframe --columns name,source,frame_index,pts_s,keyframe,width,height,split --match 'clip000*'
step hframe get sample/clips.hframe 'clip000.mp4#frame=5' -o sample/clip000-5.jpg
# look instead of read: contact sheets (open sample/sheet.jpg and sample/clip000.png)
step hframe sheet sample/photos.hframe --sample 24 --seed 1 --columns 6 -o sample/sheet.jpg
step hframe sheet sample/clips.hframe --match 'clip000*' --columns 6 --tile 128 -o sample/clip000.png
step hframe pack sample/records -o sample/records.hframe --compress zstd:3 --zstd-dict auto
step hframe verify sample/records.hframe
step hframe get sample/records.hframe 00007.json -o sample/00007.json
step cmp sample/00007.json sample/records/00007.json
step hframe bench-warm sample/records.hframe --frames 64 --batches 5 --seed 1 --md5
echo >&2
echo "pictures: sample/sheet.jpg, sample/clip000.png, sample/verify.html, sample/bench-cold.png" >&2
echo "demo ok: pack, verify, dump-header, index, get, dd, rebuild, cold/warm bench, Python reader, DataLoader (with torch), video frames, contact sheets, zstd" >&2
