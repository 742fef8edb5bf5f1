"""The host a key is checked against is the host the socket connects to, whatever the URL looks
like. A differential, property-based test: URLs are generated from a grammar of hosts, ports,
separators and look-alikes, each is sent with a key bound to the origin the check reads out of
it, through the real HTTP layer (requests and urllib3), to servers listening on several loopback
addresses (each standing for another machine) on the same two ports. A server may receive the
request only if it is the origin the check named; a URL the check reads no origin from is never
sent with a key at all."""

import contextlib
import ipaddress
import socket
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from conversations.conf import get_config
from conversations.core.budget import Budget
from conversations.endpoints import BoundKey, origin
from conversations.infra.http import BudgetedHTTP, CallFailed
from tests.support.fakes import FakeProvider, openai_text

ADDRESSES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
KEY = "sk-property-key-0042"


def free_port_on_every_address():
    """A port free on each of ``ADDRESSES``."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            port = probe.getsockname()[1]
        try:
            for address in ADDRESSES[1:]:
                with socket.socket() as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every loopback address")


@pytest.fixture(scope="module")
def machines():
    """``{(address, port): server}``: every address on the same two ports, so that only the host
    a client reads tells them apart (and only the port, for the same host)."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for port in [free_port_on_every_address(), free_port_on_every_address()]:
            for address in ADDRESSES:
                fake = stack.enter_context(FakeProvider(default=openai_text("Hello."), host=address, port=port))
                servers[(address, port)] = fake
        yield servers


def addresses_of(target):
    """The IPv4 addresses and port the client would connect to for origin ``target``."""
    location = urlsplit(target)
    port = location.port or 80
    try:
        infos = socket.getaddrinfo(location.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):  # no address: nothing to connect to
        return set()
    found = set()
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        found.add((str(ip), port))
    return found


HOSTS = [*ADDRESSES, "[::1]", "[::ffff:127.0.0.2]", "2130706434", "0x7f000003", "127.1", "127.0.0.2.",
         "[fe80::1%25lo]", "[::1%lo]", "127\u30020\u30020\u30022", "127\uff0e0\uff0e0\uff0e2"]
SEPARATORS = ["\\", "@", "#", "?", "/", ":", "%2F", "%40", "%5C", "%2E", "%252F", "%09", "\u3002", "\uff0e",
              "\uff0f", "\uff3c", "\u2215", "\ufe6b", "\uff20", "\t", " ", "\n", "\r", "\x00", ";", "[", "]",
              "evil", "evil:pw"]


@st.composite
def urls(draw, ports):
    """``scheme`` ``A`` ``separators`` [``@``] ``separators`` [``B``] ``separators`` ``path``: two
    authorities with the separators and look-alikes between them that make parsers disagree on
    which is the host."""
    # The plain forms come up about half the time, the look-alikes the other half.
    authority = st.builds(lambda host, port: host + port,
                          st.one_of(st.sampled_from(ADDRESSES), st.sampled_from(HOSTS)),
                          st.one_of(st.sampled_from([f":{port}" for port in ports]),
                                    st.sampled_from(["", ":", ":99999"])))
    # The separators that end an authority for one parser or another come up more often than the rest.
    separator = st.one_of(st.sampled_from(["\\", "#", "?", "/"]), st.sampled_from(SEPARATORS))
    separators = st.lists(separator, max_size=2).map("".join)
    joint = st.sampled_from(["@", "@", "%40", "\uff20", ":", ""])  # what ends a user information, or looks so
    scheme = draw(st.one_of(st.just("http://"), st.sampled_from(["HTTP://", "http:/", "http:\\\\", "http:///",
                                                                "http:"])))
    first, between = draw(authority), draw(separators) + draw(joint) + draw(separators)
    second = draw(st.one_of(st.just(""), authority))
    after = draw(separators)
    path = draw(st.sampled_from(["", "/v1", "/v1/chat/completions", "/v1?x=@127.0.0.2"]))
    return scheme + first + between + second + after + path


def send(url):
    """Send a request carrying ``KEY``, bound to the origin the check reads from ``url``, through the
    real HTTP layer; the ``CallFailed`` it ended with, if any."""
    target = origin(url)
    key = BoundKey(KEY, [target] if target else [])
    config = {**get_config(), "API_KEY": key, "MAX_ATTEMPTS": 1, "CONNECT_TIMEOUT": 2, "CALL_TIMEOUT": 5}
    http = BudgetedHTTP(Budget(10), config, recorder=lambda **fields: None)
    try:
        http.post_json(url, {"messages": []}, {"Authorization": f"Bearer {key}"})
    except CallFailed as failure:
        return failure
    return None


def test_the_grammar_reaches_every_machine_when_the_url_is_plain(machines):
    """The servers answer, each as itself: the property below is not true for want of a listener."""
    for (address, port), fake in machines.items():
        assert send(f"http://{address}:{port}/v1/chat/completions") is None
        assert [r["headers"]["Authorization"] for r in fake.requests][-1:] == [f"Bearer {KEY}"]


@pytest.mark.slow
def test_a_key_reaches_only_the_origin_the_check_reads(machines):
    ports = sorted({port for _, port in machines})
    gateway, evil = ports

    @settings(max_examples=2500, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(urls(ports))
    @example(f"http://127.0.0.2:{evil}\\@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.2:{gateway}\\@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.2:{gateway}#@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.2:{gateway}?@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.2:{gateway}%2F@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.2:{gateway}\t@127.0.0.1:{gateway}/v1")
    @example(f"http://127.0.0.1:{gateway}/v1")
    def check(url):
        before = {where: len(fake.requests) for where, fake in machines.items()}
        send(url)
        reached = {where for where, fake in machines.items() if len(fake.requests) > before[where]}
        target = origin(url)
        if not target:
            assert reached == set(), f"{url!r}: no origin read, yet sent to {reached}"
        else:
            assert reached <= addresses_of(target), f"{url!r}: checked as {target}, sent to {reached}"

    check()
