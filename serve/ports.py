"""Free TCP ports for the local listeners this project starts, picked where no one else picks at random.

Binding port 0 hands out a port of the kernel's ephemeral range (``net.ipv4.ip_local_port_range``,
32768-60999 by default). The same range gives every outgoing connection its local port, and Ray picks its
own listeners' ports at random in [such a port, 65535] (``ray._private.node.Node._get_unused_port``). So a
port found free with port 0 and bound later by another process (HAProxy's stats listener, bound after Ray
has started dozens of workers and connections) can be taken in between: CI failed once on exactly that,
``cannot bind socket (Address already in use) for [127.0.0.1:46755]``.

The ports here come from ``PORT_RANGE`` = 20000-29999: above Ray's worker ports (10002-19999 by
default), below Serve's direct-ingress ports (30000-31000) and the ephemeral range. Nothing on the
machine draws from it at random, so a port found free stays free unless another caller of this module
takes it; the probe starts at a random port so two clusters starting together rarely probe the same one.
"""

from __future__ import annotations

import random
import socket

__all__ = ["PORT_RANGE", "free_port", "free_ports"]

PORT_RANGE = (20000, 29999)


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports of ``PORT_RANGE`` that ``host`` can bind now.

    Raises:
        ValueError: ``count`` is below 1 or above the range's size.
        OSError: fewer than ``count`` ports of the range are free.
    """
    low, high = PORT_RANGE
    size = high - low + 1
    if not 1 <= count <= size:
        raise ValueError(f"count: must be in [1, {size}], got {count}")
    start = random.randrange(size)
    found: list[int] = []
    for step in range(size):  # bounded: each port of the range is probed at most once
        port = low + (start + step) % size
        if _bindable(host, port):
            found.append(port)
            if len(found) == count:
                return found
    raise OSError(f"only {len(found)} of the ports {low}-{high} on {host} are free; {count} needed")


def free_port(host: str = "127.0.0.1") -> int:
    """One port of ``PORT_RANGE`` that ``host`` can bind now (:func:`free_ports`)."""
    return free_ports(1, host)[0]
