"""How one service is secured, read from the environment every tiermesh service shares:

| variable | meaning | default |
| --- | --- | --- |
| TIERMESH_TLS_CA | CA that signs peers (turns TLS on, with the two below) | unset: plaintext |
| TIERMESH_TLS_CERT, TIERMESH_TLS_KEY | this service's certificate and key (PEM) | unset |
| TIERMESH_TLS_CLIENT_AUTH | `require` (mTLS) or `optional` client certificates | require |
| TIERMESH_ALLOWED_CALLERS | comma list of SPIFFE IDs allowed to call (tiers: the router) | anyone |
| TIERMESH_KEYS_FILE | API key file to enforce (router) | unset: no keys |
| TIERMESH_INSECURE | `1`: allow plaintext beyond loopback | unset |
| TIERMESH_REFLECTION | `1` / `0`: gRPC server reflection on or off | on without TLS, off with |

A service asked to listen beyond loopback without TLS refuses to start unless TIERMESH_INSECURE
is set (`--insecure`). The same CA, certificate and key make this service's client channels
mTLS (the router's channels to the tiers).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from services.common.errors import ConfigError
from services.security.tls import AllowedCallers, TlsFiles, channel_credentials, server_credentials

CLIENT_AUTH = ("require", "optional")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServiceSecurity:
    tls: TlsFiles | None = None
    client_auth: str = "require"
    allowed_callers: tuple[str, ...] = ()
    keys_file: Path | None = None
    insecure: bool = False
    reflection: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServiceSecurity:
        env = os.environ if environ is None else environ
        ca, cert, key = (
            env.get("TIERMESH_TLS_CA"),
            env.get("TIERMESH_TLS_CERT"),
            env.get("TIERMESH_TLS_KEY"),
        )
        tls = None
        if ca or cert or key:
            if not (ca and cert and key):
                raise ConfigError(
                    "TIERMESH_TLS_CA, TIERMESH_TLS_CERT and TIERMESH_TLS_KEY go together"
                )
            tls = TlsFiles(Path(ca), Path(cert), Path(key))
            tls.check("TIERMESH_TLS_*")
        client_auth = env.get("TIERMESH_TLS_CLIENT_AUTH", "require")
        if client_auth not in CLIENT_AUTH:
            raise ConfigError(
                f"TIERMESH_TLS_CLIENT_AUTH: {client_auth!r} is not one of {CLIENT_AUTH}"
            )
        callers = tuple(
            c.strip() for c in env.get("TIERMESH_ALLOWED_CALLERS", "").split(",") if c.strip()
        )
        if callers and tls is None:
            raise ConfigError("TIERMESH_ALLOWED_CALLERS needs TLS (TIERMESH_TLS_CA/CERT/KEY)")
        keys = env.get("TIERMESH_KEYS_FILE")
        reflection = env.get("TIERMESH_REFLECTION", "0" if tls else "1") == "1"
        return cls(
            tls,
            client_auth,
            callers,
            Path(keys) if keys else None,
            env.get("TIERMESH_INSECURE") == "1",
            reflection,
        )

    def check_listen(self, host: str, what: str) -> None:
        """Refuses plaintext beyond loopback unless insecure was asked for explicitly."""
        if self.tls is None and not self.insecure and not is_loopback(host):
            raise ConfigError(
                f"{what}: refusing to listen on {host} without TLS; set TIERMESH_TLS_CA, "
                "TIERMESH_TLS_CERT and TIERMESH_TLS_KEY (tiermesh certs), or pass --insecure"
            )

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.tls is None:
            return None
        return server_credentials(self.tls, require_client_auth=self.client_auth == "require")

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Credentials for this service's own client channels (mTLS with its certificate)."""
        return None if self.tls is None else channel_credentials(self.tls)

    def interceptors(self, scopes: Mapping[str, str] | None = None) -> list[Any]:
        """The caller check and, with a key file, the API key check (scopes per method)."""
        chain: list[Any] = []
        if self.allowed_callers:
            chain.append(AllowedCallers(self.allowed_callers))
        if self.keys_file is not None:
            from services.security.api_key_auth import ROUTER_SCOPES, ApiKeyAuth
            from services.security.api_keys import KeyRing

            chain.append(ApiKeyAuth(KeyRing(self.keys_file), scopes or ROUTER_SCOPES))
        return chain
