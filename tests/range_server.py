"""A small HTTP/1.1 file server on loopback that serves byte ranges, ETags and If-Match as object
stores and nginx do, and injects faults on request: the test double of a remote store for what
real servers cannot be told to do on cue (answer 500, 503 SlowDown, 429, 403 or a 302, hang,
stall mid-body, trickle a byte at a time, cut a body short, reset the connection, ignore Range,
answer another range than asked, send gzip), or demand HTTP Basic credentials (``auth``). No mock
of the client: hframe talks HTTP to it.
It answers HEAD and path-style ``/BUCKET/KEY`` too, with S3's XML error bodies, so an S3 client
(pyarrow's, with ``endpoint_override``) can be pointed at it as at a misbehaving S3.

    with RangeServer(root) as srv:
        srv.url("p.hframe")                   # http://127.0.0.1:PORT/p.hframe
        srv.faults.extend(["500", "500"])     # the next two requests fail, then all is well
        srv.path_faults["/p.hframe"] = ["403"]  # the next request of that path fails
        srv.range_faults["bytes=-64"] = ["500"]  # the next request for that Range fails
        srv.latency_s = 0.02                  # every request waits this long first (benchmarks)
        srv.auth = ("alice", "secret")        # 401 for every request without these Basic credentials
"""

from __future__ import annotations

import base64
import os
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        """What GET answers, without the body (an S3 client asks for the size and ETag so)."""
        self.head_only = True
        try:
            self.do_GET()
        finally:
            self.head_only = False

    head_only = False

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        srv = self.server.owner
        with srv.lock:
            srv.requests[self.path] += 1
            srv.log.append((self.path, self.headers.get("Range")))
            srv.authorization.append(self.headers.get("Authorization"))
            mine = srv.path_faults.get(self.path.partition("?")[0]) or srv.range_faults.get(self.headers.get("Range"))
            fault = mine.pop(0) if mine else srv.faults.pop(0) if srv.faults else None
        if srv.auth is not None and self.headers.get("Authorization") != srv.basic():
            body = b"<html><body>401 Authorization Required</body></html>"
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="hframe-test"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)
            return
        if srv.latency_s:
            key = self.path.partition("?")[0]
            mine = (self.command, self.headers.get("Range"))
            with srv.lock:
                srv.waiting += 1
                srv.peak_waiting = max(srv.peak_waiting, srv.waiting)
                srv.arrivals.append((key, *mine, tuple(srv.in_flight[key])))
                srv.in_flight[key].append(mine)
            time.sleep(srv.latency_s)
            with srv.lock:
                srv.waiting -= 1
                srv.in_flight[key].remove(mine)
        if fault in ("500", "503", "429", "403"):
            code = {"500": "InternalError", "503": "SlowDown", "429": "SlowDown", "403": "AccessDenied"}[fault]
            self._status(int(fault), f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode())
            return
        if fault == "302":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            self.close_connection = True
            self.connection.close()
            return
        if fault == "hang":
            time.sleep(srv.hang_s)
            self.close_connection = True
            return
        path = srv.root / self.path.lstrip("/").split("?", 1)[0]
        try:  # one descriptor for ETag, size and bytes, as nginx: a rename over the path mid-request
            fd = os.open(path, os.O_RDONLY)  # cannot mix two versions in one answer
        except (FileNotFoundError, IsADirectoryError):
            self._status(404, b"not found")
            return
        try:
            st = os.fstat(fd)
            tag = ("W/" if srv.weak_etag else "") + f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'
            want = self.headers.get("If-Match")
            if want is not None and (want != tag or tag.startswith("W/")):  # If-Match compares strongly
                self._status(412, b"precondition failed")
                return
            size = st.st_size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            partial = rng is not None and fault != "ignore-range"
            if partial:
                first, _, last = rng.removeprefix("bytes=").partition("-")
                if first:
                    start, end = int(first), min(int(last), size - 1)
                else:  # a suffix range: the last N bytes (RFC 9110)
                    start, end = max(0, size - int(last)), size - 1
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            if fault == "shift" and start >= 16:  # the right length, from 16 bytes early (and says so)
                start, end = start - 16, end - 16
            body = os.pread(fd, end + 1 - start, start)  # only the range: a big pack is not read whole
        finally:
            os.close(fd)
        self.send_response(206 if partial else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", tag)
        self.send_header("Accept-Ranges", "bytes")
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        if fault == "gzip":
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        if self.head_only:
            return
        if fault == "trickle":  # one byte every 0.3 s: each receive is quick, the whole is not
            for k in range(len(body)):
                self.wfile.write(body[k : k + 1])
                self.wfile.flush()
                time.sleep(0.3)
            return
        if fault == "truncate":  # the promised length, then the connection closes half-way
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if fault == "stall":  # half the body, then nothing for a long time
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(srv.hang_s)
            self.close_connection = True
            return
        self.wfile.write(body)

    def _status(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/xml")
        self.end_headers()
        if not self.head_only:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: RangeServer

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that closed its connection (a reader dropping a kept-alive connection, a
        request given up) is not an error of the server: socketserver printed a traceback."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class RangeServer:
    """The server on 127.0.0.1 (a free port), serving ``root``, in a background thread."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.faults: list[str] = []
        #: path → faults for the next requests of that path only (before ``faults``)
        self.path_faults: dict[str, list[str]] = {}
        #: Range header → faults for the next requests asking for that range (after ``path_faults``)
        self.range_faults: dict[str, list[str]] = {}
        self.latency_s = 0.0
        #: requests in their ``latency_s`` now, and the most there were at once (since reset_counts)
        self.waiting = self.peak_waiting = 0
        self.hang_s = 30.0
        self.weak_etag = False  # send W/"..." ETags (as a server that compresses on the fly)
        self.requests: Counter[str] = Counter()
        #: with ``latency_s``: each request as it arrived, (path, method, Range, the (method,
        #: Range) of the requests of that path waiting then), and those waiting now, by path
        self.arrivals: list[tuple[str, str, str | None, tuple[tuple[str, str | None], ...]]] = []
        self.in_flight: defaultdict[str, list[tuple[str, str | None]]] = defaultdict(list)
        self.log: list[tuple[str, str | None]] = []
        #: (user, password) every request must carry as HTTP Basic credentials, else 401
        self.auth: tuple[str, str] | None = None
        self.authorization: list[str | None] = []  # each request's Authorization header, in order
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.owner = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def basic(self) -> str | None:
        """The Authorization header that ``auth`` asks for (RFC 7617: UTF-8 ``user:password``)."""
        if self.auth is None:
            return None
        return "Basic " + base64.b64encode(":".join(self.auth).encode()).decode()

    def total_requests(self) -> int:
        with self.lock:
            return sum(self.requests.values())

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()
            self.peak_waiting = 0
            self.arrivals.clear()
            self.log.clear()
            self.authorization.clear()

    def __enter__(self) -> RangeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class StallingProxy:
    """A TCP proxy on 127.0.0.1 (a free port) to ``target`` (``HOST:PORT``) that can be told to
    go silent: with ``stalled`` set, it passes no more bytes either way on any connection, new
    or open (they stay open): a store that hangs mid-read, for clients whose requests cannot be
    faulted otherwise (pyarrow's GCS client in front of an emulator). Run it in a process of its
    own (``python range_server.py stall-proxy HOST:PORT``: it prints its port, and SIGUSR1
    stalls it) where the client under test may hold the GIL while it waits."""

    def __init__(self, target: str) -> None:
        host, _, port = target.partition(":")
        self.target = (host, int(port))
        self.stalled = False
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._closing = False

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                while self.stalled and not self._closing:
                    time.sleep(0.05)
                data = src.recv(1 << 16)
                while self.stalled and not self._closing:  # (what arrives meanwhile is held)
                    time.sleep(0.05)
                if not data or self._closing:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> StallingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing = True
        self.listener.close()
        for s in self._open:
            s.close()


if __name__ == "__main__":
    import signal
    import sys

    if sys.argv[1:2] != ["stall-proxy"] or len(sys.argv) != 3:
        sys.exit("usage: range_server.py stall-proxy HOST:PORT")
    with StallingProxy(sys.argv[2]) as proxy:
        signal.signal(signal.SIGUSR1, lambda *_: setattr(proxy, "stalled", True))
        print(proxy.port, flush=True)
        while True:
            time.sleep(3600)
