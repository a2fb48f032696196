"""services.net: free ports outside the kernel's ephemeral range, and ports reserved for the
servers another process will start."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import time

import pytest

from services.net import PortReservations, ephemeral_port_range, free_port, port_open


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


def test_a_reserved_port_is_never_picked_again_until_released():
    """The race that failed a job's start: the launcher picked a replica's metrics port, and
    before the replica bound it, the trainer picked the same port for its ranks."""
    reserved = PortReservations()
    try:
        held = {reserved.take() for _ in range(40)}
        assert len(held) == len(reserved) == 40
        for port in held:
            with socket.socket() as s, pytest.raises(OSError):
                s.bind(("127.0.0.1", port))  # free_port's probe fails on it
        assert all(free_port() not in held for _ in range(300))
    finally:
        reserved.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", held.pop()))  # released: free again


def test_the_server_of_another_process_binds_a_reserved_port():
    reserved = PortReservations()
    port = reserved.take()
    server = (f"import http.server; s = http.server.HTTPServer(('127.0.0.1', {port}), "
              "http.server.BaseHTTPRequestHandler); s.handle_request()")
    try:
        proc = subprocess.Popen([sys.executable, "-c", server])
        for _ in range(200):
            if port_open("127.0.0.1", port):
                break
            assert proc.poll() is None, "the server could not bind the reserved port"
            time.sleep(0.05)
        assert proc.wait(timeout=30) == 0
        # and a server in this process, after the first one has gone (a restart)
        with http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler):
            pass
    finally:
        reserved.close()
