"""A small HTTP(S) server on a loopback address for the remote-image tests.

It serves well-behaved and hostile answers (oversize, slow, truncated, redirects) and records
every request it receives, so tests can assert that a refused fetch never reached it.
Every handler is bounded in time; the server stops with the fixture that started it.
"""

from __future__ import annotations

import io
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image

# Hostile handlers give up after this long even if the client stays.
_MAX_HANDLER_S = 3.0
BIG_BODY_BYTES = 10_000


def small_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = small_png()


# A video as the fetcher sees one: an MP4's leading box, then bulk (the facade only sniffs clips).
CLIP = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\0" * (BIG_BODY_BYTES - 24)


@dataclass(frozen=True)
class SeenRequest:
    path: str
    host_header: str | None
    accept: str | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        self.server.seen.append(SeenRequest(self.path, self.headers.get("Host"), self.headers.get("Accept")))
        url = urllib.parse.urlsplit(self.path)
        route, query = url.path, urllib.parse.parse_qs(url.query)
        if route == "/image.png":
            self._send(200, PNG, "image/png")
        elif route == "/clip.mp4":
            self._send(200, CLIP, "video/mp4")
        elif route == "/big":
            self._send(200, PNG + b"\0" * (BIG_BODY_BYTES - len(PNG)), "image/png")
        elif route == "/big-chunked":
            self._chunked(PNG + b"\0" * (BIG_BODY_BYTES - len(PNG)))
        elif route == "/slow-body":
            self._slow_body()
        elif route == "/slow-headers":
            self._slow_headers()
        elif route == "/truncated":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG) + 100))
            self.end_headers()
            self.wfile.write(PNG)
            self.close_connection = True
        elif route == "/redirect":
            self._redirect(query["to"][0])
        elif route.startswith("/chain/"):
            hops = int(route.rsplit("/", 1)[1])
            self._redirect(f"/chain/{hops - 1}") if hops > 0 else self._send(200, PNG, "image/png")
        elif route == "/redirect-without-location":
            self._send(302, b"", "text/plain")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, media_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _chunked(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for start in range(0, len(body), 1000):
                chunk = body[start : start + 1000]
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def _trickle(self, data: bytes) -> None:
        """One byte every 50 ms until the client leaves or the handler's time is up."""
        stop = time.monotonic() + _MAX_HANDLER_S
        try:
            for byte in data:
                if time.monotonic() > stop:
                    break
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        self.close_connection = True

    def _slow_body(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG) * 10))
        self.end_headers()
        self.wfile.flush()
        self._trickle(PNG * 10)

    def _slow_headers(self) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self._trickle(b"X-Slow: " + b"a" * 1000 + b"\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[SeenRequest]


@dataclass
class ImageServer:
    host: str
    port: int
    scheme: str
    seen: list[SeenRequest]

    def url(self, path: str, *, host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"


@contextmanager
def serve_images(
    host: str = "127.0.0.1", *, tls_cert: Path | None = None, tls_key: Path | None = None
) -> Iterator[ImageServer]:
    """An image server on `host` (a loopback address) and a free port, https if a cert is given."""
    server = _Server((host, 0), _Handler)
    server.seen = []
    scheme = "http"
    if tls_cert is not None and tls_key is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_cert, tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield ImageServer(host, server.server_address[1], scheme, server.seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
