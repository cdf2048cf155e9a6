"""The HTTP/1.1 client under ``HttpBackend`` (``storage.wire``) against answers nginx and the
test server do not give on cue: chunked bodies, bodies framed by the connection's end, 1xx
answers before the real one, headers arriving a byte at a time, repeated headers, two answers in
one packet, and answers that are not HTTP. A scripted server on loopback sends the exact bytes;
the client is the one hframe uses (no mock of either side)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hframe_cli.storage.http import HttpBackend
from hframe_cli.storage.policy import Permanent, RequestPolicy, Transient
from hframe_cli.storage.wire import BadAnswer, Connection

BODY = bytes(range(256)) * 40  # 10,240 bytes


class Scripted:
    """Answers each request it reads with the next script: a list of byte strings sent with a
    short pause between them; ``None`` in the list closes the connection there."""

    def __init__(self, scripts: list[list[bytes | None]]) -> None:
        self.scripts = scripts
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.scripts:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                pending = b""
                while self.scripts:
                    while b"\r\n\r\n" not in pending:
                        data = conn.recv(65536)
                        if not data:
                            break
                        pending += data
                    if b"\r\n\r\n" not in pending:
                        break
                    request, _, pending = pending.partition(b"\r\n\r\n")
                    self.requests.append(request)
                    closed = False
                    for piece in self.scripts.pop(0):
                        if piece is None:
                            closed = True
                            break
                        conn.sendall(piece)
                        time.sleep(0.002)
                    if closed:
                        break

    def close(self) -> None:
        self.sock.close()


def answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode() + body


def ranged(first: int, body: bytes, total: int, **extra: str) -> bytes:
    return answer(
        "206 Partial Content",
        {"Content-Length": str(len(body)), "Content-Range": f"bytes {first}-{first + len(body) - 1}/{total}", **extra},
        body,
    )


@pytest.fixture
def backend():
    made: list[Scripted] = []

    def make(scripts: list[list[bytes | None]]) -> tuple[HttpBackend, Scripted]:
        srv = Scripted(scripts)
        made.append(srv)
        policy = RequestPolicy.from_env(environ={"HFRAME_IO_REQUEST_TIMEOUT": "2"})
        return HttpBackend(f"http://127.0.0.1:{srv.port}/p.hframe", policy), srv

    yield make
    for srv in made:
        srv.close()


def test_a_chunked_body_is_read_whole(backend):
    chunks = b"".join(f"{n:x};ext=1\r\n".encode() + BODY[a : a + n] + b"\r\n" for a, n in ((0, 4000), (4000, 6240)))
    whole = answer("200 OK", {"Transfer-Encoding": "chunked", "ETag": '"x"'}, chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
    b, srv = backend([[whole[:7], whole[7:5000], whole[5000:]], [ranged(0, BODY[:10], len(BODY))]])
    resp = b.get(0, None, None)
    assert resp.body == BODY and resp.size == len(BODY) and resp.etag == '"x"'
    assert b.get(0, 10, None).body == BODY[:10]  # the same connection, read to the chunked body's end
    assert srv.connections == 1


def test_a_body_framed_by_the_end_of_the_connection(backend):
    b, srv = backend([[answer("200 OK", {"Connection": "close"}, BODY), None], [ranged(5, BODY[5:9], len(BODY))]])
    assert b.get(0, None, None).body == BODY
    assert b.get(5, 4, None).body == BODY[5:9]  # on a new connection
    assert srv.connections == 2


def test_headers_a_byte_at_a_time_1xx_first_repeated_headers(backend):
    real = ranged(100, BODY[100:300], len(BODY), ETag='"e"', **{"X-A": "1"}).replace(
        b"X-A: 1\r\n", b"X-A: 1\r\nX-A: 2\r\n"
    )
    info = b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
    b, srv = backend([[info, *[real[i : i + 1] for i in range(120)], real[120:]]])
    resp = b.get(100, 200, '"e"')
    assert resp.body == BODY[100:300] and resp.size == len(BODY) and resp.etag == '"e"'
    assert b'If-Match: "e"' in srv.requests[0] and b"Range: bytes=100-299" in srv.requests[0]
    conn = Connection("127.0.0.1", 1, False, 1.0)
    conn._buf = b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"
    assert conn.answer(lambda: 1.0).getheader("X-A") == "1, 2"


def test_two_answers_in_one_packet_are_two_answers(backend):
    first, second = ranged(0, BODY[:50], len(BODY)), ranged(50, BODY[50:80], len(BODY))
    b, srv = backend([[first + second], []])  # the second request's answer came early: it is used
    assert b.get(0, 50, None).body == BODY[:50]
    assert b.get(50, 30, None).body == BODY[50:80]
    assert srv.connections == 1


@pytest.mark.parametrize(
    "script, words",
    [
        ([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], "not an HTTP/1.x status line"),
        (
            [
                b"HTTP/1.1 206 Partial\r\nContent-Length: 500\r\nContent-Range: bytes 0-499/9999\r\n\r\n" + BODY[:100],
                None,
            ],
            "body cut short: 100 of 500",
        ),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], "chunk size"),
        ([b"HTTP/1.1 206 Partial\r\nBroken header line\r\n\r\n"], "not a header line"),
    ],
)
def test_answers_that_are_not_http_or_end_early_are_transient(backend, script, words):
    b, _ = backend([script])
    with pytest.raises(Transient, match=words):
        b.get(0, 500, None)


def test_an_answer_without_a_body_by_definition_is_not_waited_for(backend):
    """A 204 (as a misconfigured proxy may give) has no body, whatever its headers lack: it is
    refused at once as the status it is, not waited on until the timeout."""
    b, srv = backend([[b'HTTP/1.1 204 No Content\r\nETag: "x"\r\n\r\n'], [ranged(0, BODY[:10], len(BODY))]])
    b.policy.request_timeout_s = 60.0  # a wait for a body would run into it: a hang, not a speed
    t0 = time.monotonic()
    with pytest.raises(Permanent, match="HTTP 204"):
        b.get(0, 10, None)
    assert time.monotonic() - t0 < 30


def test_a_kept_alive_connection_closed_by_the_server_is_asked_again_once(backend):
    b, srv = backend([[ranged(0, BODY[:10], len(BODY)), None], [ranged(10, BODY[10:20], len(BODY))]])
    assert b.get(0, 10, None).body == BODY[:10]
    time.sleep(0.05)  # the server has closed the connection the client keeps
    assert b.get(10, 10, None).body == BODY[10:20]  # asked again on a new one, not failed
    assert srv.connections == 2


def test_bad_answer_is_an_oserror_so_connection_failures_are_handled_alike():
    assert issubclass(BadAnswer, OSError)
