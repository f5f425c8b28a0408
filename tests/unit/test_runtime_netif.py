"""Which interface holds an address: the one a rank's gloo listens on (runtime/gang/netif.py)."""

import socket

import pytest

from aicluster.runtime.gang.netif import interface_of


def test_the_loopback_address_is_on_the_loopback_interface() -> None:
    names = {name for _, name in socket.if_nameindex()}
    assert interface_of("127.0.0.1") == "lo" and "lo" in names


@pytest.mark.parametrize(
    "address",
    [
        "198.51.100.77",  # TEST-NET-2: documentation only, never a machine's
        "::1",  # IPv6: gloo keeps its own choice
        "not-an-address",
        "",
    ],
)
def test_an_address_no_interface_holds_has_none(address: str) -> None:
    assert interface_of(address) is None
