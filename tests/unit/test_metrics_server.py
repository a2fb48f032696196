"""The /health, /ready, /metrics server every service runs."""

import json
import socket
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from services.metrics import MetricsServer


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_endpoints_and_readiness():
    reg = CollectorRegistry()
    c = Counter("meshrl_test_things_total", "things", registry=reg)
    c.inc(3)
    ready = {"ok": False}
    srv = MetricsServer(reg, ready=lambda: ready["ok"], status=lambda: {"step": 7}).start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        assert _get(base + "/health")[0] == 200
        assert _get(base + "/ready")[0] == 503
        ready["ok"] = True
        assert _get(base + "/ready") == (200, b'{"ready": true}')
        code, body = _get(base + "/metrics")
        assert code == 200 and b"meshrl_test_things_total 3.0" in body
        assert json.loads(_get(base + "/status")[1]) == {"step": 7}
        assert _get(base + "/nope")[0] == 404
    finally:
        srv.stop()


def test_a_failing_probe_is_not_ready_and_the_server_survives_hangups():
    def boom():
        raise RuntimeError("probe failed")

    srv = MetricsServer(CollectorRegistry(), ready=boom).start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        assert _get(base + "/ready")[0] == 503
        for _ in range(5):  # clients that hang up before the reply
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.close()
        assert _get(base + "/health")[0] == 200
    finally:
        srv.stop()
