#!/usr/bin/env python3
"""Benchmark training from a remote pack through the node cache, against the same pack on local disk.

Usage: python scripts/bench_cache.py DATA_DIR [--count N] [--rtt-ms MS] [--batch B] [--workers W] [--decode]

Packs the first ``--count`` files (default 5,000) of ``DATA_DIR/jpegs`` (``scripts/make_bench_data.py``),
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
* ``sample10_fetched_bytes``: ``hframe prefetch --sample 10%`` into an empty cache, bytes fetched.

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

RUN = r"""
import json, os, sys, time
from torch.utils.data import DataLoader
from hframe_cli.training import BlockShuffleSampler, FrameDataset
from hframe_cli.storage.access import evict_from_page_cache

where, cache, read_ahead, batch, workers, decode, cold, epoch, block = sys.argv[1:10]
read_ahead, batch, workers, epoch, block = int(read_ahead), int(batch), int(workers), int(epoch), int(block)
if cold == "1":
    for d, _, files in os.walk(cache or "/nonexistent"):
        for f in files:
            evict_from_page_cache(os.path.join(d, f))
    if not where.startswith("http"):
        evict_from_page_cache(where)
t0 = time.perf_counter()
ds = FrameDataset(where, target=None, decode="pil" if decode == "1" else None, cache_dir=cache or "")
sampler = BlockShuffleSampler(ds, seed=1, block=block, window=4 if block > 1 else 1, read_ahead=read_ahead,
                              read_ahead_batch=batch)
sampler.set_epoch(epoch)
loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=lambda b: len(b),
                    multiprocessing_context="fork", prefetch_factor=2)
n, first = 0, None
for got in loader:
    n += got
    if first is None:
        first = time.perf_counter() - t0
seconds = time.perf_counter() - t0
print(json.dumps({"frames": n, "seconds": seconds, "first_batch_s": first}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayProxy:
    """A TCP proxy on loopback that delivers every piece of data ``delay`` seconds after it
    arrived, in order, each way: latency without a bandwidth limit (as netem's delay)."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port, self.delay, self.port = target_port, delay, free_port()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer), return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
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
        [sys.executable, "-c", RUN, *argv, "1" if cold else "0", str(number), str(block)],
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
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hframe-bench-cache-")
    server = None
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
        out: dict[str, dict] = {}
        out["local_warm"] = epoch(pack, "", args)
        out["local_cold"] = epoch(pack, "", args, cold=True)
        c1, c2 = os.path.join(work, "cache1"), os.path.join(work, "cache2")
        out["remote_epoch1"] = epoch(url, c1, args)
        out["remote_epoch1_read_ahead"] = epoch(url, c2, args, read_ahead=8 * args.batch)
        c4, c5 = os.path.join(work, "cache4"), os.path.join(work, "cache5")
        out["shuffled_epoch1"] = epoch(url, c4, args, block=1)
        out["shuffled_epoch1_read_ahead"] = epoch(url, c5, args, read_ahead=8 * args.batch, block=1)
        out["cache_warm"] = epoch(url, c1, args, number=1)
        out["cache_cold"] = epoch(url, c1, args, number=2, cold=True)
        for k, v in out.items():
            print(f"{k}_frames_per_s={v['frames'] / v['seconds']:.0f}")
            print(f"{k}_first_batch_s={v['first_batch_s']:.3f}")
        rate = {k: v["frames"] / v["seconds"] for k, v in out.items()}
        print(f"cache_warm_vs_local_warm={rate['cache_warm'] / rate['local_warm']:.2f}")
        print(f"cache_cold_vs_local_cold={rate['cache_cold'] / rate['local_cold']:.2f}")
        print(f"read_ahead_vs_epoch1={rate['remote_epoch1_read_ahead'] / rate['remote_epoch1']:.2f}")
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
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
