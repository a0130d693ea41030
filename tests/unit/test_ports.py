"""recallserve.serve.ports: free ports outside the ranges that Ray and the kernel hand out at random."""

from __future__ import annotations

import socket

import pytest

from recallserve.serve import ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_and_ray_ranges() -> None:
    found = ports.free_ports(8)
    assert len(set(found)) == 8
    low, high = ports.PORT_RANGE
    assert all(low <= p <= high for p in found)
    # Ray's worker ports are 10002-19999, Serve's direct ingress 30000+, Linux's ephemeral range 32768-60999
    assert low > 19999 and high < 30000
    for port in found:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_held_port_is_skipped_and_a_full_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    free = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "PORT_RANGE", (taken, taken))
        with pytest.raises(OSError, match="only 0 of the ports"):
            ports.free_port()
        monkeypatch.setattr(ports, "PORT_RANGE", (min(taken, free), max(taken, free)))
        # every port between them may be taken or free; the held one is never returned
        assert taken not in ports.free_ports(1)
    with pytest.raises(ValueError, match="count"):
        ports.free_ports(0)
