"""services.net: free ports outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from services.net import ephemeral_port_range, free_port


def test_free_port_is_bindable_and_outside_the_ephemeral_range():
    lo, hi = ephemeral_port_range()
    assert 0 < lo <= hi < 65536
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # chosen at random, not one fixed port
    for port in ports:
        assert not lo <= port <= hi, f"{port} lies in the ephemeral range {lo}-{hi}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when asked for


def test_free_port_skips_a_port_in_use():
    taken = []
    try:
        for _ in range(50):  # hold many ports; none of them may come back while held
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            taken.append(s)
        held = {s.getsockname()[1] for s in taken}
        assert all(free_port() not in held for _ in range(200))
    finally:
        for s in taken:
            s.close()
