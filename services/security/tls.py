"""gRPC credentials from certificate files: server credentials that pick up rotated files
without a restart, channel credentials, and the check that a caller is one of the identities a
service accepts (its SPIFFE ID, from the verified client certificate).

Rotation: grpcio asks the server's fetcher for a new certificate configuration at each new
handshake; the fetcher answers with the files' new contents when their modification times
changed, so established streams keep their connection and new ones get the new certificate.
Knows nothing of what the servers serve.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from services.common.errors import ConfigError
from services.security.guarded_handlers import guard_handler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA that signs peers, and this side's certificate and key (optional for a
    client that does not present one)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def check(self, what: str) -> None:
        for field, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{what}: {field} file {path} does not exist")
        if (self.cert is None) != (self.key is None):
            raise ConfigError(f"{what}: give both a certificate and its key, or neither")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None


class RotatingCertificates:
    """The fetcher grpcio calls on each handshake: a new configuration when any file changed.

    Thread-safe (grpcio calls it from its own threads). A half-rotated pair that fails to load
    keeps the previous configuration and logs why."""

    def __init__(self, files: TlsFiles, require_client_auth: bool) -> None:
        if files.cert is None or files.key is None:
            raise ConfigError("a TLS server needs a certificate and a key")
        self._files = files
        self._require = require_client_auth
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self.rotations = 0

    def _paths(self) -> tuple[Path, ...]:
        assert self._files.cert is not None and self._files.key is not None
        return (self._files.ca, self._files.cert, self._files.key)

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in self._paths())

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = (_read(p) for p in self._paths())
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            try:
                stamp = self._mtimes()
            except OSError:
                return None
            if stamp == self._stamp:
                return None
            try:
                config = self.configuration()
            except ConfigError as e:
                log.warning("certificate rotation skipped: %s", e)
                return None
            self._stamp = stamp
            self.rotations += 1
            log.info("certificates reloaded from %s", self._files.cert)
            return config


def server_credentials(files: TlsFiles, *, require_client_auth: bool) -> grpc.ServerCredentials:
    """TLS (mTLS with `require_client_auth`) server credentials that reload rotated files."""
    files.check("server TLS")
    fetcher = RotatingCertificates(files, require_client_auth)
    return grpc.dynamic_ssl_server_credentials(
        fetcher.configuration(), fetcher, require_client_authentication=require_client_auth
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials: trust `files.ca`, present `files.cert` when given (mTLS)."""
    files.check("client TLS")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(files.ca),
        private_key=_read(files.key) if files.key else None,
        certificate_chain=_read(files.cert) if files.cert else None,
    )


def peer_spiffe_id(context: Any) -> str | None:
    """The SPIFFE ID in the caller's verified certificate, or None (plaintext, no certificate)."""
    values = context.auth_context().get("peer_spiffe_id") or []
    return values[0].decode() if values else None


class AllowedCallers(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Lets a call through only when the caller's certificate names one of `allowed` (SPIFFE
    IDs); others get PERMISSION_DENIED naming who they are. Health checks pass for anyone with
    a valid certificate, so orchestrators' probes work."""

    def __init__(self, allowed: Collection[str], open_prefixes: tuple[str, ...] = ()) -> None:
        self._allowed = frozenset(allowed)
        self._open = ("/grpc.health.v1.Health/", *open_prefixes)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(self._open):
            return handler
        return _guarded(handler, self._allowed, method)


def _denial(context: Any, allowed: frozenset[str], method: str) -> str | None:
    caller = peer_spiffe_id(context)
    if caller in allowed:
        return None
    who = caller or "a caller without a client certificate"
    return f"{method}: {who} may not call this service (allowed: {', '.join(sorted(allowed))})"


def _guarded(handler: Any, allowed: frozenset[str], method: str) -> Any:
    """The same handler with the caller check run first."""

    async def check(context: Any) -> None:
        if denial := _denial(context, allowed, method):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, denial)

    return guard_handler(handler, check)
