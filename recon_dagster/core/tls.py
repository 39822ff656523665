"""One TLS context per process for every outgoing HTTPS client (providers and media downloads).

``httpx.Client()`` builds a fresh ``ssl.SSLContext`` and loads the whole CA bundle into it: about
30 ms of CPU each on this project's machines. A reconcile run builds a client per provider it
polls plus the media client: building all five took 100-131 ms of CPU in a fresh interpreter, and
43-67 ms with the contexts shared. A context
that only verifies (no client certificate, never changed after it is built) is safe to share
between clients and threads, so each process builds it once.

The context is the one httpx would build: certifi's bundle, or with ``trust_env`` the
``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` the environment names (read when the context is first asked
for, and part of the cache key, so a changed variable gets a context of its own).
"""

from __future__ import annotations

import os
import ssl
import threading

import httpx

_contexts: dict[tuple[int, bool, str | None, str | None], ssl.SSLContext] = {}
_lock = threading.Lock()


def shared_tls_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """The process's verifying TLS context for ``trust_env`` (built on first use; never mutate it)."""
    key = (
        os.getpid(),  # a forked child builds its own: nothing is shared across a fork
        trust_env,
        os.environ.get("SSL_CERT_FILE") if trust_env else None,
        os.environ.get("SSL_CERT_DIR") if trust_env else None,
    )
    with _lock:
        context = _contexts.get(key)
        if context is None:
            context = httpx.create_ssl_context(verify=True, trust_env=trust_env)
            _contexts[key] = context
        return context


__all__ = ["shared_tls_context"]
