"""Small network helpers for launches that span several machines.

interface_for(address)                which network interface carries a local address, so
                                      gloo's sockets use the link the machines share
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

__all__ = ["local_address_towards", "interface_for"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def local_address_towards(host: str) -> str | None:
    """The local IPv4 address this machine uses to reach ``host`` (no packet is sent)."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # a UDP "connect" only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _address_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(
                probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
            )
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_for(host: str) -> str | None:
    """The name of the interface that holds the local address used to reach ``host``.

    Gloo otherwise binds to whatever the host name resolves to, often 127.0.1.1, which
    the other machines cannot reach. On machine 0 ``host`` is its own address, and the
    interface holding that address (not ``lo``) is the one the others connect to.

    Example:
        >>> interface_for("10.0.0.1")  # doctest: +SKIP
        'eth0'
    """
    local = local_address_towards(host)
    if local is None:
        return None
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            if _address_of(name) == local:
                return name
    return None
