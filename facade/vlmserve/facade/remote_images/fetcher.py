"""Safe fetching of remote (http/https) image URLs: the facade's `ImageSource`.

Off unless enabled. Every fetch, and every redirect hop (at most `max_redirects`), goes through:

1. `remote_image_checks.check_url`: one `httpx.URL` parse; scheme, userinfo, host form, port and
   the allowlist. The connection below uses that same parse's host, port and path.
2. The host is resolved once; every address it resolves to must pass the address policy
   (`is_public_address` by default). One forbidden address refuses the whole fetch.
3. The socket connects to a checked *address*, never a name (no second DNS lookup); http.client
   speaks HTTP over it, and TLS verifies the certificate against the hostname (SNI = hostname).
4. The body is streamed under a byte cap (per image, and per request via `for_request()`), and one
   deadline covers the whole fetch: a watchdog shuts the socket down when it passes, so a slow
   header or body cannot hold a worker past `timeout_s`.

Remote video and audio URLs (docs/video-audio.md) take the same path under the same settings
and allowlist (`RequestImageSource.clip`): a clip is capped by what is left of the request's byte
budget rather than by the per-image cap, and asks for `video/*` / `audio/*`.

Errors are `RemoteImageError` (an `ImageFetchError`): the client sees only "Error while
downloading <url>." or "Timeout while downloading <url>."; `cause` says why, for logs and tests.
Synchronous on purpose: the facade runs request translation in a worker thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from vlmserve.facade.remote_images.checks import (
    IPAddress,
    RefusalCause,
    Refused,
    Target,
    check_url,
    is_public_address,
    join_url,
    parse_url,
)
from vlmserve.facade.settings.remote_images import RemoteImageSettings
from vlmserve.responses import ImageFetchError

__all__ = [
    "AddressPolicy",
    "Connector",
    "RefusalCause",
    "RemoteImageError",
    "RemoteImageFetcher",
    "RequestImageSource",
    "Resolver",
    "connect_tcp",
    "image_fetcher_from_settings",
    "is_public_address",
    "resolve_host",
]

logger = logging.getLogger("vlmserve.facade.remote_images")

# (host, port) -> the addresses the host resolves to.
Resolver = Callable[[str, int], Sequence[IPAddress]]
# Whether an address may be connected to.
AddressPolicy = Callable[[IPAddress], bool]
# (address, port, timeout seconds) -> a connected TCP socket.
Connector = Callable[[IPAddress, int, float], socket.socket]

_READ_CHUNK = 64 * 1024
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_MAX_SHOWN_URL_CHARS = 512


class RemoteImageError(ImageFetchError):
    """A refused or failed fetch. `reason` is client-safe; `cause` is for logs and tests only."""

    def __init__(self, url: str, cause: RefusalCause) -> None:
        shown = url if len(url) <= _MAX_SHOWN_URL_CHARS else url[:_MAX_SHOWN_URL_CHARS] + "..."
        verb = "Timeout" if cause is RefusalCause.TIMEOUT else "Error"
        super().__init__(f"{verb} while downloading {shown}.", code="invalid_image_url")
        self.cause = cause


def resolve_host(host: str, port: int) -> list[IPAddress]:
    """The default `Resolver`: the system's getaddrinfo, TCP addresses, order kept, no duplicates."""
    addresses: list[IPAddress] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(sockaddr[0])
            if address not in addresses:
                addresses.append(address)
    return addresses


def connect_tcp(address: IPAddress, port: int, timeout: float) -> socket.socket:
    """The default `Connector`: a TCP connection to a numeric address (no name lookup)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((str(address), port))
    except BaseException:
        sock.close()
        raise
    return sock


# Resolution runs here so the fetch deadline bounds it too: getaddrinfo itself has no timeout.
_DNS_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="image-dns")


class _Deadline:
    """One deadline for a whole fetch; when it passes, the socket in use is shut down."""

    def __init__(self, seconds: float) -> None:
        self._at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        left = self._at - time.monotonic()
        if left <= 0 or self.expired:
            raise Refused(RefusalCause.TIMEOUT)
        return left

    def guard(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._sock is not None:
                _shutdown(self._sock)


def _shutdown(sock: socket.socket) -> None:
    # The base-class call acts on the file descriptor (also under an SSLSocket being read in
    # another thread) and makes a blocked read return at once.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _PinnedConnection(http.client.HTTPConnection):
    """http.client over a socket already connected to a checked address; it resolves nothing."""

    def __init__(self, sock: socket.socket, target: Target) -> None:
        super().__init__(target.host, target.port)
        self._pinned = sock

    def connect(self) -> None:
        self.sock = self._pinned


class RemoteImageFetcher:
    """Long-lived (one per facade): settings, resolver, address policy, TLS context.

    Not an ImageSource itself: `for_request()` gives one with its own byte and time budget.
    `resolver`, `address_allowed` and `connector` exist for tests (e.g. to permit 127.0.0.1).
    """

    def __init__(
        self,
        settings: RemoteImageSettings,
        *,
        resolver: Resolver = resolve_host,
        address_allowed: AddressPolicy = is_public_address,
        connector: Connector = connect_tcp,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.settings = settings
        self._resolver = resolver
        self._address_allowed = address_allowed
        self._connector = connector
        self._ssl_context = ssl_context or ssl.create_default_context()

    def for_request(self) -> RequestImageSource:
        return RequestImageSource(self)

    def fetch(self, url: str, *, max_bytes: int, time_budget_s: float, accept: str = "image/*") -> bytes:
        """One image's (or clip's) bytes (at most `max_bytes`), or RemoteImageError."""
        try:
            if not self.settings.enabled:
                raise Refused(RefusalCause.DISABLED)
            with _Deadline(min(self.settings.timeout_s, time_budget_s)) as deadline:
                try:
                    return self._follow(url, max_bytes, deadline, accept)
                except Refused:
                    raise
                except (OSError, http.client.HTTPException, ValueError) as error:
                    raise Refused(_cause_of(error, deadline), type(error).__name__) from None
        except Refused as refusal:
            logger.info("remote image refused: %s %s", refusal.cause.value, refusal.detail)
            raise RemoteImageError(url, refusal.cause) from None
        except Exception:
            # An I/O boundary: a bug here must still reach the client as a 400, and us loudly.
            logger.exception("remote image fetch failed unexpectedly")
            raise RemoteImageError(url, RefusalCause.PROTOCOL) from None

    def _follow(self, url: str, max_bytes: int, deadline: _Deadline, accept: str) -> bytes:
        current = parse_url(url)
        for _hop in range(self.settings.max_redirects + 1):
            result = self._get(check_url(current, self.settings), max_bytes, deadline, accept)
            if isinstance(result, bytes):
                return result
            current = join_url(current, result)  # re-checked in full on the next hop
        raise Refused(RefusalCause.REDIRECTS)

    def _addresses(self, target: Target, deadline: _Deadline) -> list[IPAddress]:
        if target.literal is not None:
            addresses: Sequence[IPAddress] = [target.literal]
        else:
            future = _DNS_POOL.submit(self._resolver, target.host, target.port)
            try:
                addresses = future.result(timeout=deadline.remaining())
            except concurrent.futures.TimeoutError:
                raise Refused(RefusalCause.TIMEOUT, "dns") from None
            except OSError:
                raise Refused(RefusalCause.DNS) from None
        if not addresses:
            raise Refused(RefusalCause.DNS)
        for address in addresses:
            if not self._address_allowed(address):
                raise Refused(RefusalCause.ADDRESS, str(address))
        # An IPv4-mapped address is reached over IPv4: the address checked is the one connected to.
        return [
            address.ipv4_mapped
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None
            else address
            for address in addresses
        ]

    def _connect(self, target: Target, deadline: _Deadline) -> socket.socket:
        for address in self._addresses(target, deadline):
            try:
                sock = self._connector(address, target.port, deadline.remaining())
            except OSError:
                if deadline.expired:
                    raise
                continue  # try the host's next (already checked) address
            deadline.guard(sock)
            if target.scheme == "http":
                return sock
            tls = self._ssl_context.wrap_socket(
                sock, server_hostname=target.host, do_handshake_on_connect=False
            )
            deadline.guard(tls)
            try:
                tls.settimeout(deadline.remaining())
                tls.do_handshake()
            except BaseException:
                tls.close()
                raise
            return tls
        raise Refused(RefusalCause.CONNECT)

    def _get(self, target: Target, max_bytes: int, deadline: _Deadline, accept: str) -> bytes | str:
        """The body (bytes), or a redirect's Location (str)."""
        sock = self._connect(target, deadline)
        connection = _PinnedConnection(sock, target)
        try:
            sock.settimeout(deadline.remaining())
            connection.request(
                "GET",
                target.path,
                headers={
                    "Host": target.host_header,
                    "Accept": accept,
                    "Accept-Encoding": "identity",
                    "User-Agent": "vlmserve-image-fetcher",
                    "Connection": "close",
                },
            )
            response = connection.getresponse()
            if response.status in _REDIRECT_STATUSES:
                location = response.getheader("Location")
                if not location:
                    raise Refused(RefusalCause.HTTP_STATUS, "redirect without Location")
                return location
            if response.status != 200:
                raise Refused(RefusalCause.HTTP_STATUS, str(response.status))
            return _read_body(response, max_bytes, deadline)
        finally:
            connection.close()
            sock.close()


def _cause_of(error: Exception, deadline: _Deadline) -> RefusalCause:
    if deadline.expired:
        return RefusalCause.TIMEOUT
    if isinstance(error, ssl.SSLError):
        return RefusalCause.TLS
    if isinstance(error, OSError):
        return RefusalCause.CONNECT
    return RefusalCause.PROTOCOL


def _read_body(response: http.client.HTTPResponse, max_bytes: int, deadline: _Deadline) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise Refused(RefusalCause.TOO_LARGE, "Content-Length")
    chunks: list[bytes] = []
    received = 0
    while True:
        deadline.remaining()
        # read1 returns after one socket read, so the deadline is checked between trickled bytes.
        chunk = response.read1(_READ_CHUNK)
        if not chunk:
            break
        received += len(chunk)
        if received > max_bytes:
            raise Refused(RefusalCause.TOO_LARGE, "body")
        chunks.append(chunk)
    if deadline.expired:
        raise Refused(RefusalCause.TIMEOUT)
    if response.length:  # the server sent fewer bytes than its Content-Length: a truncated image
        raise Refused(RefusalCause.PROTOCOL, "truncated body")
    return b"".join(chunks)


class RequestImageSource:
    """The `ImageSource` for one request: its fetches share one byte budget and one time budget."""

    def __init__(self, fetcher: RemoteImageFetcher) -> None:
        self.fetcher = fetcher
        self.bytes_fetched = 0
        self.images_fetched = 0
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, url: str) -> bytes:
        return self._fetch(url, per_fetch=self.fetcher.settings.max_bytes_per_image, accept="image/*")

    def clip(self, url: str) -> bytes:
        """A remote video or audio clip: the request's byte budget is its only byte cap (a clip
        is larger than an image; the engine bounds its duration and frames from its header)."""
        per_fetch = self.fetcher.settings.max_bytes_per_request
        return self._fetch(url, per_fetch=per_fetch, accept="video/*, audio/*")

    def _fetch(self, url: str, *, per_fetch: int, accept: str) -> bytes:
        settings = self.fetcher.settings
        with self._lock:
            budget = settings.max_bytes_per_request - self.bytes_fetched
        time_left = settings.request_timeout_s - (time.monotonic() - self._started)
        if budget <= 0:
            raise RemoteImageError(url, RefusalCause.REQUEST_BUDGET)
        if time_left <= 0:
            raise RemoteImageError(url, RefusalCause.TIMEOUT)
        cap = min(per_fetch, budget)
        try:
            data = self.fetcher.fetch(url, max_bytes=cap, time_budget_s=time_left, accept=accept)
        except RemoteImageError as error:
            if error.cause is RefusalCause.TOO_LARGE and cap < per_fetch:
                raise RemoteImageError(url, RefusalCause.REQUEST_BUDGET) from None
            raise
        with self._lock:
            self.bytes_fetched += len(data)
            self.images_fetched += 1
        return data


def image_fetcher_from_settings(settings: RemoteImageSettings) -> RemoteImageFetcher | None:
    """The fetcher, or None when remote images are disabled (the facade then leaves
    `MediaPolicy.image_source` unset, and translation refuses http(s) URLs itself)."""
    return RemoteImageFetcher(settings) if settings.enabled else None
