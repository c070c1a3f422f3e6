"""The HTTP settings every part of pytest-kimi shares: no proxy from the environment, and one
TLS context per process.

httpx builds a new verifying TLS context for every client it makes, reading the CA bundle
again (~20 ms of CPU), even for a plain ``http://`` URL. A readiness poll, the watchdog and
the counter reads make a client per request, so a run spent more CPU loading certificates
than parsing its streams. One context, built on first use, serves them all (an
``ssl.SSLContext`` is safe to share between connections and threads).
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """The process's verifying TLS context: certifi's CA bundle, as httpx's clients with
    ``trust_env=False`` use (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` are not read)."""
    return httpx.create_ssl_context(trust_env=False)


def client(**options: Any) -> httpx.Client:
    """``httpx.Client(**options)`` that ignores proxy variables and shares :func:`tls`."""
    return httpx.Client(trust_env=False, verify=tls(), **options)


def async_client(**options: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient(**options)``, as :func:`client`."""
    return httpx.AsyncClient(trust_env=False, verify=tls(), **options)


def get(url: str, timeout: float) -> httpx.Response:
    """One GET without a client kept: ``httpx.get`` as :func:`client` would send it."""
    return httpx.get(url, timeout=timeout, trust_env=False, verify=tls())
