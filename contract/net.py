"""Small networking helpers shared by the launcher, the learner, scripts, tests and benchmarks
(no dependency on the server or the learner, so any of them may import it)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another process may take it before
    the caller binds, so callers that race retry). ``host=""``: free on every interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def route_source_address(host: str, port: int) -> str | None:
    """This machine's address on its route to ``host``: the source address the kernel picks
    for packets to it (a UDP ``connect`` sends nothing). On a machine with several networks it
    is the address ``host`` can reach back, which the hostname's address need not be (a
    container on two Docker networks resolves its hostname to the first one's). None when
    ``host`` does not resolve or no route leads to it. IPv4 where ``host`` has both."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    # IPv4 first: gloo's ranks must agree on a family, and hostnames resolve to IPv4 there
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
                return str(s.getsockname()[0])
        except OSError:
            continue
    return None


def interface_addresses() -> dict[str, str]:
    """Each network interface's IPv4 address, by name (Linux; empty elsewhere). Interfaces
    with no IPv4 address are left out."""
    try:
        import fcntl
        import struct

        found: dict[str, str] = {}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                      struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                found[name] = socket.inet_ntoa(raw[20:24])
        return found
    except (ImportError, OSError, AttributeError):
        return {}


def interface_of(address: str) -> str | None:
    """The name of the interface that holds the IPv4 ``address``, or None."""
    return next((n for n, a in interface_addresses().items() if a == address), None)
