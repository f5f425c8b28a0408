"""Which network interface of this machine holds an address: where a rank's gloo must listen.

torch's gloo listens on the address its machine's host name resolves to, and on loopback when
that fails. Debian resolves the host name to 127.0.1.1 (``/etc/hosts``), and inside a tenant's
sandbox the host name (``sandbox``) resolves to nothing: either way ranks on other machines could
not connect. The runtime therefore names the interface of the Ray node's own address, which the
other machines reach by definition, in ``GLOO_SOCKET_IFNAME`` (torch reads it).
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["GLOO_SOCKET_IFNAME", "interface_of"]

GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (first) IPv4 address
_IFNAMSIZ = 16


def interface_of(address: str) -> str | None:
    """The name of the interface whose IPv4 address is ``address``, or None (an IPv6 or
    unknown address, or no such interface here)."""
    try:
        wanted = socket.inet_aton(address)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack(f"{_IFNAMSIZ}s{256 - _IFNAMSIZ}x", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if answer[20:24] == wanted:  # struct ifreq: name, then a sockaddr_in
                return name
    return None
