"""GET requests to the local servers the simulator starts (node daemons, Prometheus, Grafana).

Standard library only, so ``fleetscope demo`` runs on a plain ``pip install``.
Proxies from the environment are ignored: every server here is on loopback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# What a refused, reset or timed-out connection raises (URLError and socket errors are OSErrors).
RequestError = OSError


def get(url: str, timeout: float, params: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Status and body of a GET; an HTTP error status is returned, a failed connection raises OSError."""
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def get_json(url: str, timeout: float, params: dict[str, str] | None = None) -> Any:
    status, body = get(url, timeout, params)
    if status != 200:
        raise RequestError(f"{url}: HTTP {status}: {body[:200]!r}")
    return json.loads(body)


def answers_ok(url: str, timeout: float = 2.0) -> bool:
    """The server answers 200 (False while it is still starting)."""
    try:
        return get(url, timeout)[0] == 200
    except RequestError:
        return False
