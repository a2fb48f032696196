"""Reading another service's HTTP endpoints: ``/health``, ``/ready``, ``/status``, ``/metrics``.

Every call has a deadline and never raises for a peer that is down: a supervisor, the
feeder and the launchers poll services that may be restarting at any moment.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``; returns (status, body). Connection errors give status 0."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback only)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, exc.read()
        except (OSError, http.client.HTTPException):  # the body timed out (a loaded machine): the status is the answer
            return exc.code, b""
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return 0, b""


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """Sum of every sample of each metric at ``url`` (Prometheus text format); {} if unreachable."""
    status, body = http_get(url, timeout=timeout)
    return parse_metrics(body) if status == 200 else {}


def parse_metrics(body: bytes) -> dict[str, float]:
    """Sum of every sample of each metric in a ``/metrics`` body; {} if it does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except ValueError:
        return {}
    return out
