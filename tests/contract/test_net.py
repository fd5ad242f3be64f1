"""Which local address and interface the weight broadcast uses towards the learner."""

from __future__ import annotations

import os
import sys

import pytest

from gspo_rl.contract.net import interface_addresses, interface_of, route_source_address
from gspo_rl.contract.weights import collective as weight_transport

LINUX = pytest.mark.skipif(sys.platform != "linux", reason="interface addresses: Linux ioctl")


def _no_nccl_ifname(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset for the test, and whatever the test sets is undone after it (``delenv`` of an
    unset variable records nothing to undo)."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth-before-the-test")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")


def _non_loopback() -> tuple[str, str] | None:
    return next(((n, a) for n, a in interface_addresses().items()
                 if not a.startswith("127.")), None)


def test_the_route_to_a_local_address_starts_from_it():
    assert route_source_address("127.0.0.1", 9) == "127.0.0.1"
    found = _non_loopback()
    if found is not None:
        assert route_source_address(found[1], 9) == found[1]


def test_a_name_with_both_families_routes_over_ipv4():
    assert route_source_address("localhost", 9) == "127.0.0.1"


def test_no_route_or_no_name_gives_none():
    assert route_source_address("no-such-host.invalid", 9) is None


@LINUX
def test_interface_of_names_the_holder():
    held = interface_addresses()
    assert held.get("lo") == "127.0.0.1"
    for name, address in held.items():
        if list(held.values()).count(address) == 1:
            assert interface_of(address) == name
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: no interface holds it


@LINUX
def test_nccl_is_pinned_to_the_interface_towards_the_master(monkeypatch: pytest.MonkeyPatch):
    found = _non_loopback()
    if found is None:
        pytest.skip("no non-loopback IPv4 interface on this machine")
    _no_nccl_ifname(monkeypatch)
    weight_transport.pin_nccl_interface(found[1], 29500)
    assert os.environ["NCCL_SOCKET_IFNAME"] == f"={found[0]}"


def test_nccl_keeps_its_own_choice_on_loopback_and_the_users(monkeypatch: pytest.MonkeyPatch):
    _no_nccl_ifname(monkeypatch)
    weight_transport.pin_nccl_interface("127.0.0.1", 29500)  # everything on one host
    assert "NCCL_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    found = _non_loopback()
    weight_transport.pin_nccl_interface(found[1] if found else "127.0.0.1", 29500)
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
