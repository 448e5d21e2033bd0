"""Small network helpers for launches that span several machines.

interface_for(address)                which network interface carries a local address, so
                                      gloo's sockets use the link the machines share
network_env(config)                   GLOO_SOCKET_IFNAME for the workers of several machines
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

from ... import env
from ...config import LaunchConfig

__all__ = ["interface_for", "local_address_towards", "network_env"]

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


def network_env(config: LaunchConfig) -> list[tuple[str, str]]:
    """GLOO_SOCKET_IFNAME for several machines: the interface that reaches ``master_addr``.

    Without it gloo binds to what the host name resolves to (often 127.0.1.1 from
    /etc/hosts), and ranks on other machines cannot connect. A value the user set wins.
    """
    if config.num_nodes == 1 or env.gloo_interface():
        return []
    name = interface_for(config.master_addr)
    return [("GLOO_SOCKET_IFNAME", name)] if name else []
