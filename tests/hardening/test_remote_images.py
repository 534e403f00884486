"""The remote image fetcher refuses SSRF tricks, bounds size and time, and fetches what it should.

Network rule: traffic only to 127.0.0.0/8. Addresses outside it appear only through an injected
resolver or as literals, and the tests assert that no connection was attempted for them.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.hardening._certs import PKIFiles, make_pki
from tests.hardening._image_server import BIG_BODY_BYTES, PNG, ImageServer, serve_images
from vlmserve.facade.remote_images.checks import IPAddress, is_public_address
from vlmserve.facade.remote_images.fetcher import (
    RefusalCause,
    RemoteImageError,
    RemoteImageFetcher,
    connect_tcp,
    image_fetcher_from_settings,
)
from vlmserve.facade.settings import FacadeSettings
from vlmserve.facade.settings.remote_images import RemoteImageSettings
from vlmserve.responses import InvalidRequestError, build_generate_request

LOCALHOST = ipaddress.IPv4Address("127.0.0.1")


class Recorder:
    """A resolver and a connector that record their calls; only 127.0.0.0/8 may be connected to."""

    def __init__(self, names: dict[str, Sequence[str]] | None = None) -> None:
        self.names = {name: [ipaddress.ip_address(a) for a in addrs] for name, addrs in (names or {}).items()}
        self.resolved: list[str] = []
        self.connected: list[IPAddress] = []

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        self.resolved.append(host)
        if host not in self.names:
            raise OSError("no such host")
        return self.names[host]

    def connect(self, address: IPAddress, port: int, timeout: float) -> socket.socket:
        self.connected.append(address)
        assert address in ipaddress.ip_network("127.0.0.0/8"), f"test tried to reach {address}"
        return connect_tcp(address, port, timeout)


def permit_localhost(address: IPAddress) -> bool:
    """The test's address policy: the default, plus exactly 127.0.0.1 (where the test server is)."""
    return address == LOCALHOST or is_public_address(address)


def make_fetcher(
    recorder: Recorder,
    *,
    policy: Callable[[IPAddress], bool] = permit_localhost,
    ssl_context: ssl.SSLContext | None = None,
    **settings: object,
) -> RemoteImageFetcher:
    options: dict[str, object] = {
        "enabled": True,
        "allowed_domains": ("allowed.example", "127.0.0.1"),
        "allow_http": True,
        "timeout_s": 2.0,
    }
    options.update(settings)
    return RemoteImageFetcher(
        RemoteImageSettings(**options),  # type: ignore[arg-type]
        resolver=recorder.resolve,
        address_allowed=policy,
        connector=recorder.connect,
        ssl_context=ssl_context,
    )


def refusal(fetcher: RemoteImageFetcher, url: str) -> RemoteImageError:
    with pytest.raises(RemoteImageError) as caught:
        fetcher.for_request()(url)
    return caught.value


def assert_refused(error: RemoteImageError, url: str, cause: RefusalCause) -> None:
    assert error.cause is cause
    verb = "Timeout" if cause is RefusalCause.TIMEOUT else "Error"
    assert error.reason == f"{verb} while downloading {url}."
    assert error.code == "invalid_image_url"


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    with serve_images("127.0.0.1") as running:
        yield running


@pytest.fixture(scope="module")
def other_loopback_server() -> Iterator[ImageServer]:
    """On 127.0.0.2: a forbidden address that must never receive a request."""
    with serve_images("127.0.0.2") as running:
        yield running


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKIFiles:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: PKIFiles) -> Iterator[ImageServer]:
    with serve_images("127.0.0.1", tls_cert=pki.server.cert, tls_key=pki.server.key) as running:
        yield running


@pytest.fixture
def recorder(server: ImageServer) -> Recorder:
    server.seen.clear()
    return Recorder({"allowed.example": ["127.0.0.1"]})


# --- happy paths -------------------------------------------------------------------------------


def test_allowed_domain_on_a_permitted_address_returns_the_bytes(
    server: ImageServer, recorder: Recorder
) -> None:
    url = server.url("/image.png?size=small", host="allowed.example")
    assert make_fetcher(recorder).for_request()(url) == PNG
    assert recorder.resolved == ["allowed.example"]
    assert recorder.connected == [LOCALHOST]
    # The connection went to the checked address, while the request names the host.
    assert [(seen.path, seen.host_header) for seen in server.seen] == [
        ("/image.png?size=small", f"allowed.example:{server.port}")
    ]


def test_allowlisted_ip_literal_is_fetched_without_dns(server: ImageServer, recorder: Recorder) -> None:
    assert make_fetcher(recorder).for_request()(server.url("/image.png")) == PNG
    assert recorder.resolved == []


def test_redirects_up_to_the_limit_are_followed(server: ImageServer, recorder: Recorder) -> None:
    fetcher = make_fetcher(recorder, max_redirects=3)
    assert fetcher.for_request()(server.url("/chain/3")) == PNG
    url = server.url("/chain/4")
    assert_refused(refusal(fetcher, url), url, RefusalCause.REDIRECTS)


def test_https_verifies_the_hostname_on_the_pinned_address(tls_server: ImageServer, pki: PKIFiles) -> None:
    recorder = Recorder({"allowed.example": ["127.0.0.1"], "wrong.example": ["127.0.0.1"]})
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    fetcher = make_fetcher(
        recorder, ssl_context=context, allow_http=False, allowed_domains=("allowed.example", "wrong.example")
    )
    assert fetcher.for_request()(tls_server.url("/image.png", host="allowed.example")) == PNG
    assert tls_server.seen[-1].host_header == f"allowed.example:{tls_server.port}"
    # Same address, a name the certificate does not carry: TLS refuses it.
    url = tls_server.url("/image.png", host="wrong.example")
    assert_refused(refusal(fetcher, url), url, RefusalCause.TLS)


def test_https_with_the_system_trust_store_refuses_an_unknown_ca(tls_server: ImageServer) -> None:
    fetcher = make_fetcher(Recorder({"allowed.example": ["127.0.0.1"]}), allow_http=False)
    url = tls_server.url("/image.png", host="allowed.example")
    assert_refused(refusal(fetcher, url), url, RefusalCause.TLS)


def test_the_fetcher_plugs_into_request_translation(server: ImageServer, recorder: Recorder) -> None:
    """Through the one media choke point: `build_generate_request(..., image_source=...)`."""
    image = {"type": "input_image", "image_url": server.url("/image.png")}
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"}, image]}]}
    translated = build_generate_request(body, image_source=make_fetcher(recorder).for_request())
    images = [
        part.image
        for message in translated.request.messages
        for part in message.parts
        if part.HasField("image")
    ]
    assert [(image.data, image.media_type) for image in images] == [(PNG, "image/png")]
    image["image_url"] = bad = server.url("/missing")
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(body, image_source=make_fetcher(recorder).for_request())
    assert (caught.value.status, caught.value.param) == (400, "input[0].content[1].image_url")
    assert caught.value.message == f"Error while downloading {bad}."


# --- off unless enabled, allowlist, scheme -------------------------------------------------------


def test_disabled_by_default(server: ImageServer, recorder: Recorder) -> None:
    settings = RemoteImageSettings()
    assert not settings.enabled
    assert image_fetcher_from_settings(settings) is None
    fetcher = make_fetcher(recorder, enabled=False)
    url = server.url("/image.png")
    assert_refused(refusal(fetcher, url), url, RefusalCause.DISABLED)
    assert (recorder.resolved, recorder.connected, server.seen) == ([], [], [])


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("http://other.example/image.png", RefusalCause.DOMAIN),
        ("http://allowed.example.evil.test/image.png", RefusalCause.DOMAIN),
        ("http://127.0.0.3/image.png", RefusalCause.DOMAIN),
        ("ftp://allowed.example/image.png", RefusalCause.SCHEME),
        ("file:///etc/passwd", RefusalCause.SCHEME),
        ("gopher://allowed.example/", RefusalCause.SCHEME),
        ("//allowed.example/image.png", RefusalCause.SCHEME),
    ],
)
def test_hosts_off_the_allowlist_and_other_schemes_are_refused_before_dns(
    url: str, cause: RefusalCause
) -> None:
    recorder = Recorder({"allowed.example": ["127.0.0.1"]})
    assert_refused(refusal(make_fetcher(recorder), url), url, cause)
    assert (recorder.resolved, recorder.connected) == ([], [])


def test_http_is_refused_when_https_only(server: ImageServer, recorder: Recorder) -> None:
    url = server.url("/image.png", host="allowed.example")
    assert_refused(refusal(make_fetcher(recorder, allow_http=False), url), url, RefusalCause.SCHEME)
    assert (recorder.resolved, recorder.connected, server.seen) == ([], [], [])


def test_wildcard_allows_subdomains_only() -> None:
    settings = RemoteImageSettings(enabled=True, allowed_domains=("*.Images.Example.", "Bücher.example"))
    assert settings.allowed_domains == ("*.images.example", "xn--bcher-kva.example")
    assert settings.allows_host("cdn.images.example", is_literal=False)
    assert settings.allows_host("a.b.images.example", is_literal=False)
    assert not settings.allows_host("images.example", is_literal=False)
    assert not settings.allows_host("evilimages.example", is_literal=False)
    assert settings.allows_host("xn--bcher-kva.example", is_literal=False)


@pytest.mark.parametrize(
    "entry", ["*", "*.", "a b.example", "under_score.example", "*.0.0.1", "http://x.example"]
)
def test_bad_allowlist_entries_are_refused_at_startup(entry: str) -> None:
    with pytest.raises(ValueError):
        RemoteImageSettings(enabled=True, allowed_domains=(entry,))


def test_settings_from_env() -> None:
    settings = FacadeSettings.from_env(
        {
            "VLMSERVE_FACADE_REMOTE_IMAGES_ENABLED": "true",
            "VLMSERVE_FACADE_REMOTE_IMAGES_ALLOWED_DOMAINS": "a.example, *.b.example",
            "VLMSERVE_FACADE_REMOTE_IMAGES_MAX_BYTES_PER_IMAGE": "1000",
            "VLMSERVE_FACADE_REMOTE_IMAGES_TIMEOUT_S": "2.5",
        }
    ).remote_images
    assert (settings.enabled, settings.allowed_domains) == (True, ("a.example", "*.b.example"))
    assert (settings.max_bytes_per_image, settings.timeout_s, settings.allow_http) == (1000, 2.5, False)
    with pytest.raises(ValueError, match="ENABLED"):
        FacadeSettings.from_env({"VLMSERVE_FACADE_REMOTE_IMAGES_ENABLED": "maybe"})


# --- forbidden addresses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "literal",
    ["127.0.0.1", "169.254.169.254", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:a9fe:a9fe]", "[fe80::1]"],
)
def test_forbidden_ip_literals_are_refused_before_connecting(literal: str, server: ImageServer) -> None:
    server.seen.clear()
    recorder = Recorder()
    host = literal.strip("[]")
    fetcher = make_fetcher(recorder, policy=is_public_address, allowed_domains=(host,))
    url = f"http://{literal}:{server.port}/image.png"
    assert_refused(refusal(fetcher, url), url, RefusalCause.ADDRESS)
    assert (recorder.resolved, recorder.connected, server.seen) == ([], [], [])


@pytest.mark.parametrize(
    "addresses",
    [
        ["10.0.0.1"],
        ["192.168.1.1"],
        ["172.16.5.4"],
        ["100.64.0.1"],  # CGNAT
        ["169.254.169.254"],  # cloud metadata
        ["127.0.0.1"],
        ["0.0.0.0"],
        ["224.0.0.1"],
        ["255.255.255.255"],
        ["::1"],
        ["::"],
        ["fe80::1"],
        ["fc00::1"],
        ["fd00:ec2::254"],  # AWS metadata over IPv6
        ["::ffff:10.0.0.1"],  # IPv4-mapped
        ["64:ff9b::a00:1"],  # NAT64 of 10.0.0.1
        ["64:ff9b::a9fe:a9fe"],  # NAT64 of 169.254.169.254
        ["2002:c0a8:101::1"],  # 6to4 of 192.168.1.1
        ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],  # Teredo
        ["8.8.8.8", "10.0.0.1"],  # one bad record spoils the lot
    ],
)
def test_names_resolving_to_forbidden_addresses_are_refused_before_connecting(addresses: list[str]) -> None:
    recorder = Recorder({"allowed.example": addresses})
    url = "https://allowed.example/image.png"
    assert_refused(refusal(make_fetcher(recorder, policy=is_public_address), url), url, RefusalCause.ADDRESS)
    assert recorder.resolved == ["allowed.example"]
    assert recorder.connected == []


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::808:808", True),
        ("2002:808:808::1", True),
        ("100.63.255.255", True),
        ("100.128.0.0", True),
        ("100.64.0.0", False),
        ("172.31.255.255", False),
        ("192.0.0.8", False),
        ("198.18.0.1", False),
        ("240.0.0.1", False),
        ("fec0::1", False),
        ("ff02::1", False),
        ("::127.0.0.1", False),  # IPv4-compatible (deprecated)
        ("64:ff9b:1::1", False),  # local-use NAT64
        ("2001:db8::1", False),
    ],
)
def test_address_policy_table(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


# --- parser disagreements ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://allowed.example\\@127.0.0.1/image.png",
        "http://allowed.example\\.127.0.0.1/image.png",
        "http://user@allowed.example@127.0.0.1/image.png",
        "http://user:secret@allowed.example/image.png",
        "http://allowed.example%2F@127.0.0.1/image.png",
        "http://allowed.example:80@127.0.0.1/image.png",
        "http://2130706433/image.png",  # 127.0.0.1 as one decimal number
        "http://0177.0.0.1/image.png",  # octal
        "http://0x7f.0.0.1/image.png",  # hex
        "http://0x7f000001/image.png",
        "http://127.1/image.png",
        "http://%31%32%37.0.0.1/image.png",  # percent-encoded host
        "http://allowed%2eexample/image.png",
        "http://allowed.example%00.evil/image.png",
        "http://[fe80::1%25lo]/image.png",  # zone id
        "http://allowed_example/image.png",
        "http://allowed.example:99999/image.png",
        "http://:80/image.png",
        "http:allowed.example/image.png",
        "http://xn--/image.png",
        "http://allowed.example/\timage.png",
    ],
)
def test_urls_that_parsers_could_read_differently_are_refused(url: str) -> None:
    # The allowlist names allowed.example and 127.0.0.1: each trick aims to pass one while reaching
    # the other (or to be read as 127.0.0.1 by some parser). All are refused as malformed.
    recorder = Recorder({"allowed.example": ["127.0.0.1"]})
    error = refusal(make_fetcher(recorder, policy=is_public_address), url)
    assert_refused(error, url, RefusalCause.BAD_URL)
    assert recorder.connected == []


def test_idn_host_is_compared_and_resolved_in_its_idna_form() -> None:
    recorder = Recorder({"xn--bcher-kva.example": ["10.0.0.1"]})
    fetcher = make_fetcher(recorder, policy=is_public_address, allowed_domains=("bücher.example",))
    url = "https://BÜCHER.example/image.png"
    assert_refused(refusal(fetcher, url), url, RefusalCause.ADDRESS)
    assert recorder.resolved == ["xn--bcher-kva.example"]


# --- redirects ------------------------------------------------------------------------------------

ALLOWED_FOR_REDIRECTS = (
    "allowed.example",
    "*.allowed.example",
    "127.0.0.1",
    "127.0.0.2",
    "169.254.169.254",
    "::ffff:127.0.0.2",
)


@pytest.mark.parametrize(
    ("target", "cause"),
    [
        ("http://127.0.0.2:{other}/image.png", RefusalCause.ADDRESS),
        ("http://loopback.allowed.example:{other}/image.png", RefusalCause.ADDRESS),
        ("http://169.254.169.254/latest/meta-data/", RefusalCause.ADDRESS),
        ("http://[::ffff:127.0.0.2]:{other}/image.png", RefusalCause.ADDRESS),
        ("http://elsewhere.example/image.png", RefusalCause.DOMAIN),
        ("http://allowed.example\\@127.0.0.2/", RefusalCause.BAD_URL),
        ("file:///etc/passwd", RefusalCause.SCHEME),
    ],
)
def test_every_redirect_is_checked_again(
    server: ImageServer, other_loopback_server: ImageServer, target: str, cause: RefusalCause
) -> None:
    server.seen.clear()
    other_loopback_server.seen.clear()
    recorder = Recorder({"allowed.example": ["127.0.0.1"], "loopback.allowed.example": ["127.0.0.2"]})
    fetcher = make_fetcher(
        recorder,
        allowed_domains=ALLOWED_FOR_REDIRECTS,
    )
    location = target.format(other=other_loopback_server.port)
    url = server.url("/redirect?to=" + location.replace("\\", "%5C"), host="allowed.example")
    assert_refused(refusal(fetcher, url), url, cause)
    assert recorder.connected == [LOCALHOST]
    assert other_loopback_server.seen == []
    assert len(server.seen) == 1


def test_redirect_without_location_is_an_error(server: ImageServer, recorder: Recorder) -> None:
    url = server.url("/redirect-without-location")
    assert_refused(refusal(make_fetcher(recorder), url), url, RefusalCause.HTTP_STATUS)


def test_https_to_http_downgrade_is_refused(
    tls_server: ImageServer, server: ImageServer, pki: PKIFiles
) -> None:
    recorder = Recorder({"allowed.example": ["127.0.0.1"]})
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    fetcher = make_fetcher(recorder, ssl_context=context, allow_http=False)
    url = tls_server.url(
        "/redirect?to=" + server.url("/image.png", host="allowed.example"), host="allowed.example"
    )
    assert_refused(refusal(fetcher, url), url, RefusalCause.SCHEME)


# --- size, time, broken answers -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/big", "/big-chunked"])
def test_oversize_bodies_are_refused(path: str, server: ImageServer, recorder: Recorder) -> None:
    url = server.url(path)
    error = refusal(make_fetcher(recorder, max_bytes_per_image=BIG_BODY_BYTES - 1), url)
    assert_refused(error, url, RefusalCause.TOO_LARGE)
    assert make_fetcher(recorder, max_bytes_per_image=BIG_BODY_BYTES).for_request()(url)[: len(PNG)] == PNG


def test_the_request_budget_spans_all_of_a_requests_images(server: ImageServer, recorder: Recorder) -> None:
    fetcher = make_fetcher(recorder, max_bytes_per_request=len(PNG) * 2 + 10)
    source = fetcher.for_request()
    url = server.url("/image.png")
    assert source(url) == PNG
    assert source(url) == PNG
    assert_refused(refusal_from(source, url), url, RefusalCause.REQUEST_BUDGET)
    assert source.bytes_fetched == 2 * len(PNG)
    assert fetcher.for_request()(url) == PNG  # a new request, a new budget


def refusal_from(source: Callable[[str], bytes], url: str) -> RemoteImageError:
    with pytest.raises(RemoteImageError) as caught:
        source(url)
    return caught.value


@pytest.mark.parametrize("path", ["/slow-body", "/slow-headers"])
def test_slow_answers_time_out_on_the_whole_fetch(path: str, server: ImageServer, recorder: Recorder) -> None:
    url = server.url(path)
    started = time.monotonic()
    assert_refused(refusal(make_fetcher(recorder, timeout_s=0.6), url), url, RefusalCause.TIMEOUT)
    assert time.monotonic() - started < 1.5


def test_the_request_time_budget_spans_all_of_a_requests_images(
    server: ImageServer, recorder: Recorder
) -> None:
    source = make_fetcher(recorder, timeout_s=0.5, request_timeout_s=0.8).for_request()
    with pytest.raises(RemoteImageError):
        source(server.url("/slow-body"))
    started = time.monotonic()
    url = server.url("/slow-body")
    assert_refused(refusal_from(source, url), url, RefusalCause.TIMEOUT)
    assert time.monotonic() - started < 0.6


@pytest.mark.parametrize(
    ("path", "cause"), [("/truncated", RefusalCause.PROTOCOL), ("/missing", RefusalCause.HTTP_STATUS)]
)
def test_broken_answers_are_errors(
    path: str, cause: RefusalCause, server: ImageServer, recorder: Recorder
) -> None:
    url = server.url(path)
    assert_refused(refusal(make_fetcher(recorder), url), url, cause)


def test_connection_refused_is_an_error(recorder: Recorder) -> None:
    url = "http://127.0.0.1:1/image.png"
    assert_refused(refusal(make_fetcher(recorder), url), url, RefusalCause.CONNECT)


def test_long_urls_are_shortened_in_the_message(recorder: Recorder) -> None:
    url = "http://other.example/" + "a" * 2000
    error = refusal(make_fetcher(recorder), url)
    assert error.reason == f"Error while downloading {url[:512]}...."
