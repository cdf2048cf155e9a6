"""HTTP/1.1 GETs on one keep-alive connection, lean: what ``HttpBackend`` sends and reads.

Imports inside functions: ssl, for an https connection only.

``http.client`` costs 130 us of CPU per ranged GET of a 34 KB frame (its header parsing goes
through ``email.parser``); this does the same exchange in about 30 us (measured against nginx on
loopback, 3,000 GETs on one thread). An epoch read remotely is one request per frame or run,
on two cores shared with the training loop, so that CPU is the epoch's. It speaks only what a
ranged GET needs: a request line and a few headers out; a status line, headers, and a body
framed by ``Content-Length``, chunked transfer coding, or the end of the connection in. Every
receive runs under the timeout its caller sets (``deadline``); a malformed answer is
``BadAnswer``, an answer that ends early is ``Truncated`` (both ``OSError``s, like a reset
connection: the caller's retries handle them alike).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

__all__ = ["Answer", "BadAnswer", "Connection", "Truncated"]

_MAX_HEAD = 64 * 1024  # status line and headers at most this long
_RECV = 256 * 1024


class BadAnswer(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Truncated(OSError):
    """The connection ended inside an answer."""


class Answer:
    """A status line and headers (names lower-cased; repeated ones joined with ", ")."""

    __slots__ = ("status", "reason", "headers", "keep_alive")

    def __init__(self, status: int, reason: str, headers: dict[str, str], keep_alive: bool) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.keep_alive = keep_alive

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


class Connection:
    """One connection to ``host:port`` (TLS with ``https``), opened by ``connect``; ``sock`` is
    None until then and after ``close``."""

    def __init__(self, host: str, port: int, https: bool, connect_timeout: float) -> None:
        self.host = host
        self.port = port
        self.https = https
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None
        self._host_header = host if port == (443 if https else 80) else f"{host}:{port}"
        if ":" in host and not host.startswith("["):  # an IPv6 literal
            self._host_header = f"[{host}]" if port == (443 if https else 80) else f"[{host}]:{port}"
        self._buf = b""  # received and not yet used (the start of the next answer, or of a body)

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.https:
                import ssl  # (15 ms: only for https)

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock, self._buf = sock, b""

    def close(self) -> None:
        sock, self.sock, self._buf = self.sock, None, b""
        if sock is not None:
            sock.close()

    def request(self, target: str, headers: dict[str, str]) -> None:
        """Send ``GET target`` with ``headers`` (and Host)."""
        assert self.sock is not None
        lines = [f"GET {target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def _recv(self, timeout: Callable[[], float]) -> bytes:
        assert self.sock is not None
        self.sock.settimeout(timeout())
        return self.sock.recv(_RECV)

    def answer(self, timeout: Callable[[], float]) -> Answer:
        """The next answer's status line and headers (informational 1xx answers skipped).

        Raises:
            ConnectionResetError: the connection ended before a byte of the answer came (a
                kept-alive connection the server had closed: the request never reached it).
        """
        while True:
            started = bool(self._buf)
            while True:
                end = self._buf.find(b"\r\n\r\n")
                if end >= 0:
                    break
                if len(self._buf) > _MAX_HEAD:
                    raise BadAnswer(f"an answer's headers longer than {_MAX_HEAD} bytes")
                data = self._recv(timeout)
                if not data:
                    if not started:
                        raise ConnectionResetError("the server closed the connection without answering")
                    raise Truncated("the connection ended inside an answer's headers")
                started = True
                self._buf += data
            head, self._buf = self._buf[:end], self._buf[end + 4 :]
            lines = head.decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
                raise BadAnswer(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise BadAnswer(f"not a header line: {line[:80]!r}")
                name, value = name.strip().lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            status = int(code)
            if 100 <= status < 200:
                continue  # 100 Continue, 103 Early Hints: the answer follows
            connection = headers.get("connection", "").lower()
            keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
            return Answer(status, reason, headers, keep)

    def body(self, ans: Answer, timeout: Callable[[], float], limit: int | None = None) -> bytes:
        """The answer's body: ``Content-Length`` bytes, the chunks of a chunked one, or what
        comes until the server closes; none for 204 and 304, which never have one. ``limit``:
        read at most this much of it (an error page), then the connection is closed (the rest
        is not read)."""
        if ans.status in (204, 304):
            return b""
        if "chunked" in ans.headers.get("transfer-encoding", "").lower():
            return self._chunked(ans, timeout, limit)
        declared = ans.headers.get("content-length")
        if declared is None:
            ans.keep_alive = False  # framed by the end of the connection
            return self._until_closed(timeout, limit)
        if not declared.isdigit():
            raise BadAnswer(f"Content-Length {declared[:40]!r}")
        n = int(declared)
        if limit is not None and n > limit:
            ans.keep_alive = False
            n = limit
        return self._exactly(n, timeout)

    def _exactly(self, n: int, timeout: Callable[[], float]) -> bytes:
        have = self._buf
        if len(have) >= n:
            self._buf = have[n:]
            return have[:n]
        assert self.sock is not None
        out = bytearray(n)
        view = memoryview(out)
        view[: len(have)] = have
        got, self._buf = len(have), b""
        while got < n:
            self.sock.settimeout(timeout())
            k = self.sock.recv_into(view[got:], min(n - got, 1 << 20))
            if not k:
                raise Truncated(f"body cut short: {got} of {n} bytes")
            got += k
        view.release()
        return bytes(out)

    def _until_closed(self, timeout: Callable[[], float], limit: int | None) -> bytes:
        parts = [self._buf]
        got = len(self._buf)
        self._buf = b""
        while limit is None or got < limit:
            data = self._recv(timeout)
            if not data:
                break
            parts.append(data)
            got += len(data)
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    def _line(self, timeout: Callable[[], float]) -> bytes:
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line, self._buf = self._buf[:end], self._buf[end + 2 :]
                return line
            if len(self._buf) > _MAX_HEAD:
                raise BadAnswer("a chunk size line too long")
            data = self._recv(timeout)
            if not data:
                raise Truncated("the connection ended inside a chunked body")
            self._buf += data

    def _chunked(self, ans: Answer, timeout: Callable[[], float], limit: int | None) -> bytes:
        parts: list[bytes] = []
        got = 0
        while True:
            size = self._line(timeout).split(b";", 1)[0].strip()
            try:
                n = int(size, 16)
            except ValueError:
                raise BadAnswer(f"chunk size {size[:20]!r}") from None
            if n == 0:
                while self._line(timeout):  # trailer fields, up to the empty line
                    pass
                return b"".join(parts)
            if limit is not None and got + n > limit:
                ans.keep_alive = False
                parts.append(self._exactly(limit - got, timeout))
                return b"".join(parts)
            parts.append(self._exactly(n, timeout))
            got += n
            if self._line(timeout):
                raise BadAnswer("no line end after a chunk")
