#!/usr/bin/env python3
"""Benchmark training from a remote pack through the node cache, against the same pack on local disk.

Usage: python scripts/bench_cache.py DATA_DIR [--count N] [--rtt-ms MS] [--batch B] [--workers W] [--decode] [--read-ahead-run BYTES] [--repeat N] [--mds [--mds-repeat N]]

Packs the first ``--count`` files (default 20,000: all of them; an epoch of 5,000 lasts about a
second, and the DataLoader's start weighs as much as the reading) of ``DATA_DIR/jpegs`` (``scripts/make_bench_data.py``),
serves the pack with nginx (``apt-get install nginx-light``) behind a delaying proxy on loopback
that holds every piece of data ``--rtt-ms / 2`` (default 10 ms) each way (netem is not
available here: this is the round trip a nearby object store adds), and reads one epoch per run
through ``FrameDataset`` + ``BlockShuffleSampler`` + a torch ``DataLoader`` (``--workers`` 2,
``--batch`` 256; ``--decode``: PIL decodes each JPEG too, as training does). Each run is a new
process; page caches are evicted for the cold runs (``posix_fadvise``, as ``bench-cold`` does).

Runs (frames/s of the epoch, and seconds to the first batch):

* ``local_warm`` / ``local_cold``: the pack on local disk;
* ``remote_epoch1``: the remote pack with a new, empty cache, no read-ahead;
* ``remote_epoch1_read_ahead``: the same with ``read_ahead = 8 * batch``;
* ``shuffled_epoch1`` / ``shuffled_epoch1_read_ahead``: the same two with a plain shuffle
  (``block=1, window=1``: every frame its own request, latency-bound), the others use the
  sampler's default blocks (64 x 4: a batch is a few long ranges);
* ``cache_warm`` / ``cache_cold``: a second epoch, every frame in the cache;
* ``sample10_fetched_bytes``: ``hframe prefetch --sample 10%`` into an empty cache, bytes fetched;
* ``link_limit_frames_per_s``: the whole pack fetched through the proxy in 8 parallel ranges (best
  of 3), in frames/s: what the link can carry, the physical limit of any epoch 1.

``--mds`` adds the same images read through S3 clients (the same nginx, behind the same proxy,
serving the files at path-style ``/BUCKET/KEY`` URLs) by hframe (node cache + read-ahead) and by
MosaicML Streaming (MDS shards of its default 64 MB, its local cache): epoch 1 and 2 frames/s,
time to the first batch, bytes fetched for a 10% random sample; ``--mds-repeat`` runs of each
(default 3, alternated), the median reported, every run's frames/s printed.

Each kind of run is made ``--repeat`` times (default 3; alternated, each with new caches),
every run's frames/s printed and the run of median frames/s reported: one epoch of 20,000
frames from the cache lasts about 0.3 s, and a start 0.1 s slower moves its rate by a third.

Every run prints its frames/s over the whole epoch (importing the reader's library, the open
and the DataLoader's start included; torch, which both use, is imported before), its seconds
to the first batch, and ``steady``: frames/s after the first batch.

Ratios (goals from issue 34): ``cache_warm_vs_local_warm`` and ``cache_cold_vs_local_cold`` >= 0.8;
``read_ahead_vs_epoch1`` (and ``shuffled_read_ahead_vs_epoch1``) >= 3; ``sample10_bytes_share`` (fetched / pack) about 0.1.
Output: one ``key=value`` line per measurement or ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")

#: the end of both runs: the epoch through the DataLoader, timed, as one JSON line
EPOCH = r"""
n, first = 0, None
for got in loader:
    n += got
    if first is None:
        first = time.perf_counter() - t0
seconds = time.perf_counter() - t0
print(json.dumps({"frames": n, "seconds": seconds, "first_batch_s": first, "batch": batch}))
"""

RUN = (
    r"""
import json, os, sys, time
from torch.utils.data import DataLoader

where, cache, read_ahead, batch, workers, decode, cold, epoch, block, run = sys.argv[1:11]
read_ahead, batch, workers, epoch, block = int(read_ahead), int(batch), int(workers), int(epoch), int(block)


def evict(path):  # (as hframe bench-cold does; written out here: hframe is imported inside the timing)
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


if cold == "1":
    for d, _, files in os.walk(cache or "/nonexistent"):
        for f in files:
            evict(os.path.join(d, f))
    if "://" not in where:
        evict(where)
t0 = time.perf_counter()
from hframe_cli.training import BlockShuffleSampler, FrameDataset
ds = FrameDataset(where, target=None, decode="pil" if decode == "1" else None, cache_dir=cache or "")
sampler = BlockShuffleSampler(ds, seed=1, block=block, window=4 if block > 1 else 1, read_ahead=read_ahead,
                              read_ahead_batch=batch, read_ahead_run=int(run))
sampler.set_epoch(epoch)
loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=lambda b: len(b),
                    multiprocessing_context="fork", prefetch_factor=2)
"""
    + EPOCH
)

#: MosaicML Streaming's epoch over the same images (MDS shards on the same S3 server, behind the
#: same proxy). streaming 0.13 imports transformers and torchvision at import time for its text
#: and vision helpers, which this run does not use: those two modules are stubbed in this process
#: (install it with ``pip install --no-deps mosaicml-streaming xxhash zstd python-snappy cramjam
#: brotli catalogue filelock``; its full requirements pull a CUDA torch).
STUBS = """
import sys, types
for name, attrs in {"transformers": [], "transformers.feature_extraction_utils": ["BatchFeature"],
                    "transformers.tokenization_utils_base": ["BatchEncoding"], "transformers.models": [],
                    "transformers.models.auto": [], "transformers.models.auto.tokenization_auto": ["AutoTokenizer"],
                    "torchvision": [], "torchvision.datasets": ["VisionDataset"], "torchvision.transforms": [],
                    "torchvision.transforms.functional": ["to_tensor"]}.items():
    if name not in sys.modules:
        module = types.ModuleType(name)
        for a in attrs:
            setattr(module, a, type(a, (), {}))
        sys.modules[name] = module
"""

RUN_MDS = (
    r"""
import io, json, os, random, sys, time
"""
    + STUBS
    + r"""
from torch.utils.data import DataLoader

remote, local, batch, workers, decode, epoch, sample = sys.argv[1:8]
batch, workers, epoch, sample = int(batch), int(workers), int(epoch), int(sample)
t0 = time.perf_counter()
from streaming import StreamingDataset


class Images(StreamingDataset):
    def __getitem__(self, i):
        image = super().__getitem__(i)["image"]
        if decode == "1":
            from PIL import Image
            Image.open(io.BytesIO(image)).load()
        return image


ds = Images(remote=remote, local=local, shuffle=True, shuffle_seed=1 + epoch, batch_size=batch)
# MDS at its best: the S3 client it made here (for index.json) is dropped before the DataLoader
# forks; streaming 0.13 keeps it, and forked workers then share its keep-alive connection (here
# 2 of 3 epoch-1 runs stalled until its 60 s read timeout)
for stream in ds.streams:
    stream._downloader.clean_up()
if sample:  # a random sample, read one by one: each frame's shard is downloaded whole
    for i in random.Random(1).sample(range(len(ds)), sample):
        ds.get_item(i)
    print(json.dumps({"frames": sample, "seconds": time.perf_counter() - t0}))
    sys.exit(0)
loader = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=lambda b: len(b),
                    multiprocessing_context="fork", prefetch_factor=2)
"""
    + EPOCH
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayProxy:
    """A TCP proxy on loopback that delivers every piece of data ``delay`` seconds after it
    arrived, in order, each way: latency without a bandwidth limit (as netem's delay)."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port, self.delay, self.port = target_port, delay, free_port()
        self.delivered = 0  # bytes sent back to clients (what readers fetched)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    def close(self) -> None:
        """Stop serving and end the connections still open (quietly: the runs are over)."""

        async def stop() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer, count=True), return_exceptions=True)
        except (asyncio.CancelledError, OSError):  # closed at the end of the runs, or by a client
            writer.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool = False) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                if count:
                    self.delivered += len(data)
                await dst.drain()
            dst.close()

        task = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(1 << 16)
                await queue.put((time.monotonic() + self.delay, data))
                if not data:
                    break
        finally:
            await task


def nginx(root: str, work: str) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    os.makedirs(work, exist_ok=True)
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(
            f"""{"user root;" if os.geteuid() == 0 else ""}
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 100000;
  client_body_temp_path {work}/b; proxy_temp_path {work}/p; fastcgi_temp_path {work}/f;
  uwsgi_temp_path {work}/u; scgi_temp_path {work}/s;
  server {{ listen 127.0.0.1:{port}; root {root}; location / {{ }} }} }}
"""
        )
    proc = subprocess.Popen([exe, "-c", conf, "-p", work, "-g", "daemon off;"])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not start")


def link_limit(url: str, size: int, streams: int = 8) -> float:
    """Seconds to GET the whole pack through the proxy in ``streams`` parallel ranges: the most
    any reader can get from this link (the physical limit of an epoch 1)."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    step = -(-size // streams)

    def get(start: int) -> int:
        req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{min(size, start + step) - 1}"})
        with urllib.request.urlopen(req) as r:
            return len(r.read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        got = sum(pool.map(get, range(0, size, step)))
    assert got == size, (got, size)
    return time.perf_counter() - t0


def mds_epoch(remote: str, local: str, args: argparse.Namespace, *, number: int = 0, sample: int = 0) -> dict:
    argv = [remote, local, str(args.batch), str(args.workers), "1" if args.decode else "0", str(number), str(sample)]
    r = subprocess.run([sys.executable, "-c", RUN_MDS, *argv], capture_output=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"MDS run failed: {r.stderr.decode()[-2000:]}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def against_mds(
    args: argparse.Namespace, work: str, src: str, names: list[str], pack: str, www: str, proxy: DelayProxy
) -> None:
    """hframe (node cache + read-ahead) and MosaicML Streaming (MDS shards + local cache) reading
    the same images through their S3 clients (pyarrow's, boto3), from one server behind the
    same delaying proxy: nginx serving the bucket's files at path-style URLs (``/BUCKET/KEY``:
    HEAD and ranged GET, the part of S3 both readers use). Not moto: it answers a ranged GET
    in time proportional to the object (about 140 ms for 40 KB of a 160 MB object), which
    would measure moto."""
    exec(STUBS)
    from streaming import MDSWriter  # type: ignore[import-not-found]

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    bucket = os.path.join(www, "bench")
    shards = os.path.join(bucket, "mds")
    os.makedirs(bucket)
    for f in (pack, pack + ".index.parquet"):
        os.link(f, os.path.join(bucket, os.path.basename(f)))
    classes = sorted({n.split(os.sep)[0] for n in names})
    with MDSWriter(out=shards, columns={"image": "bytes", "label": "int"}) as w:  # (64 MB shards)
        for n in names:
            with open(os.path.join(src, n), "rb") as f:
                w.write({"image": f.read(), "label": classes.index(n.split(os.sep)[0])})
    mds_bytes = sum(os.path.getsize(os.path.join(shards, f)) for f in os.listdir(shards))
    os.environ["S3_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"  # (MDS's setting)
    url = f"s3://bench/p.hframe?endpoint_override=127.0.0.1:{proxy.port}&scheme=http"
    remote = "s3://bench/mds"
    print(f"mds_shards={len(os.listdir(shards)) - 1}")
    print(f"mds_bytes={mds_bytes}")
    runs: dict[str, list[dict]] = {}
    for n in range(args.mds_repeat):  # (alternated, each with new caches; MDS's epoch 1 varies most)
        c, m = os.path.join(work, f"s3cache{n}"), os.path.join(work, f"mdslocal{n}")
        runs.setdefault("s3_hframe_epoch1", []).append(epoch(url, c, args, read_ahead=8 * args.batch))
        runs.setdefault("s3_hframe_epoch2", []).append(epoch(url, c, args, read_ahead=8 * args.batch, number=1))
        runs.setdefault("s3_mds_epoch1", []).append(mds_epoch(remote, m, args))
        runs.setdefault("s3_mds_epoch2", []).append(mds_epoch(remote, m, args, number=1))
    out = medians(runs)
    report(out)
    rate = {k: v["frames"] / v["seconds"] for k, v in out.items()}
    for e in ("epoch1", "epoch2"):
        print(f"hframe_vs_mds_{e}={rate[f's3_hframe_{e}'] / rate[f's3_mds_{e}']:.2f}")
    for e in ("epoch1", "epoch2"):
        first = out[f"s3_mds_{e}"]["first_batch_s"] / out[f"s3_hframe_{e}"]["first_batch_s"]
        print(f"mds_vs_hframe_first_batch_time_{e}={first:.2f}")
    sample = len(names) // 10
    before = proxy.delivered
    subprocess.run(
        [HFRAME, "prefetch", url, "--sample", str(sample), "--seed", "1", "--cache-dir", c + "10", "-q"],
        check=True,
    )
    hframe_bytes = proxy.delivered - before
    before = proxy.delivered
    mds_epoch(remote, m + "10", args, sample=sample)
    mds_sample_bytes = proxy.delivered - before
    print(f"s3_hframe_sample10_bytes={hframe_bytes}")
    print(f"s3_mds_sample10_bytes={mds_sample_bytes}")
    print(f"mds_vs_hframe_sample10_bytes={mds_sample_bytes / max(hframe_bytes, 1):.2f}")


def medians(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each run's frames/s printed; for each kind, the run of median frames/s."""
    for k, vs in runs.items():
        print(f"{k}_runs_frames_per_s={','.join(str(round(v['frames'] / v['seconds'])) for v in vs)}")
    return {k: sorted(vs, key=lambda v: v["frames"] / v["seconds"])[len(vs) // 2] for k, vs in runs.items()}


def report(out: dict[str, dict]) -> None:
    """Each run's frames/s over the whole epoch (opening included), seconds to the first batch,
    and frames/s after it (the steady rate, the open and first round trips left out)."""
    for k, v in out.items():
        print(f"{k}_frames_per_s={v['frames'] / v['seconds']:.0f}")
        print(f"{k}_first_batch_s={v['first_batch_s']:.3f}")
        after = v["seconds"] - v["first_batch_s"]
        if after > 0:
            print(f"{k}_steady_frames_per_s={(v['frames'] - v['batch']) / after:.0f}")


def epoch(
    where: str,
    cache: str,
    args: argparse.Namespace,
    *,
    read_ahead: int = 0,
    cold: bool = False,
    number: int = 0,
    block: int = 64,
) -> dict:
    argv = [where, cache, str(read_ahead), str(args.batch), str(args.workers), "1" if args.decode else "0"]
    r = subprocess.run(
        [sys.executable, "-c", RUN, *argv, "1" if cold else "0", str(number), str(block), str(args.read_ahead_run)],
        capture_output=True,
        check=False,
        env={**os.environ, "HFRAME_CACHE_DIR": ""},
    )
    if r.returncode != 0:
        raise SystemExit(f"run failed: {r.stderr.decode()[-2000:]}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode", action="store_true")
    ap.add_argument(
        "--read-ahead-run",
        type=int,
        default=256 << 10,
        help="BlockShuffleSampler(read_ahead_run=...): bytes one read-ahead request may cover (0: frames asked for only)",
    )
    ap.add_argument(
        "--mds", action="store_true", help="also read the same images through S3 clients, hframe and MosaicML Streaming"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each epoch (hframe alone: local, remote, cache; medians reported)",
    )
    ap.add_argument("--mds-repeat", type=int, default=3, help="runs of each reader against MDS (medians reported)")
    args = ap.parse_args()
    # as installed by pip: the package's bytecode compiled once (with PYTHONDONTWRITEBYTECODE set,
    # as here and on CI machines, a source tree's edited modules are compiled again at every start:
    # 100+ ms of a remote open once, when its storage modules had changed)
    import hframe_cli

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(hframe_cli.__file__)], check=True)
    work = tempfile.mkdtemp(prefix="hframe-bench-cache-")
    server = None
    proxy: DelayProxy | None = None
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        names = sorted(
            os.path.relpath(os.path.join(d, f), os.path.join(args.data_dir, "jpegs"))
            for d, _, fs in os.walk(os.path.join(args.data_dir, "jpegs"))
            for f in fs
        )[: args.count]
        for n in names:
            os.makedirs(os.path.dirname(os.path.join(src, n)), exist_ok=True)
            shutil.copyfile(os.path.join(args.data_dir, "jpegs", n), os.path.join(src, n))
        www = os.path.join(work, "www")
        os.makedirs(www)
        pack = os.path.join(www, "p.hframe")
        subprocess.run([HFRAME, "pack", src, "-o", pack, "-q"], check=True)
        server, port = nginx(www, os.path.join(work, "nginx"))
        proxy = DelayProxy(port, args.rtt_ms / 2000)
        url = f"http://127.0.0.1:{proxy.port}/p.hframe"
        size = os.path.getsize(pack)
        print(f"frames={len(names)}")
        print(f"pack_bytes={size}")
        print(f"rtt_ms={args.rtt_ms:g}")
        epoch(pack, "", args)  # (warms the pack's pages)
        runs: dict[str, list[dict]] = {}
        for n in range(args.repeat):  # (each run with new caches; a single epoch's start moves its rate most)
            c1, c2, c4, c5 = (os.path.join(work, f"cache{k}-{n}") for k in (1, 2, 4, 5))
            runs.setdefault("local_warm", []).append(epoch(pack, "", args))
            runs.setdefault("local_cold", []).append(epoch(pack, "", args, cold=True))
            runs.setdefault("remote_epoch1", []).append(epoch(url, c1, args))
            runs.setdefault("remote_epoch1_read_ahead", []).append(epoch(url, c2, args, read_ahead=8 * args.batch))
            runs.setdefault("shuffled_epoch1", []).append(epoch(url, c4, args, block=1))
            runs.setdefault("shuffled_epoch1_read_ahead", []).append(
                epoch(url, c5, args, read_ahead=8 * args.batch, block=1)
            )
            runs.setdefault("cache_warm", []).append(epoch(url, c1, args, number=1))
            runs.setdefault("cache_cold", []).append(epoch(url, c1, args, number=2, cold=True))
            for c in (c1, c2, c4, c5):
                shutil.rmtree(c, ignore_errors=True)
        out = medians(runs)
        report(out)
        rate = {k: v["frames"] / v["seconds"] for k, v in out.items()}
        print(f"cache_warm_vs_local_warm={rate['cache_warm'] / rate['local_warm']:.2f}")
        print(f"cache_cold_vs_local_cold={rate['cache_cold'] / rate['local_cold']:.2f}")
        steady = {k: (v["frames"] - v["batch"]) / (v["seconds"] - v["first_batch_s"]) for k, v in out.items()}
        print(f"cache_warm_vs_local_warm_steady={steady['cache_warm'] / steady['local_warm']:.2f}")
        print(f"read_ahead_vs_epoch1={rate['remote_epoch1_read_ahead'] / rate['remote_epoch1']:.2f}")
        limit = len(names) / min(link_limit(url, size) for _ in range(3))
        print(f"link_limit_frames_per_s={limit:.0f}")  # the whole pack in 8 ranges: no epoch 1 beats it
        print(f"epoch1_read_ahead_vs_link_limit={rate['remote_epoch1_read_ahead'] / limit:.2f}")
        print(f"shuffled_read_ahead_vs_epoch1={rate['shuffled_epoch1_read_ahead'] / rate['shuffled_epoch1']:.2f}")
        c3 = os.path.join(work, "cache3")
        r = subprocess.run(
            [HFRAME, "prefetch", url, "--sample", str(len(names) // 10), "--seed", "1", "--cache-dir", c3, "--json"],
            capture_output=True,
            check=True,
        )
        doc = json.loads(r.stdout)
        print(f"sample10_fetched_bytes={doc['fetched_bytes']}")
        print(f"sample10_bytes_share={doc['fetched_bytes'] / size:.3f}")
        print(f"sample10_seconds={doc['seconds']:.2f}")
        if args.mds:
            against_mds(args, work, src, names, pack, www, proxy)
    finally:
        if proxy is not None:
            proxy.close()
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
