"""`tiermesh run --secure`: issues what a secure local mesh needs into <run dir>/certs (a CA
kept across runs, short-lived certificates for every service and for the launcher itself) and
the environment each child reads (services/security/settings.py): tiers accept only the
router's identity, the router speaks TLS to clients (client certificates optional) and mTLS to
the tiers and enforces the API keys in <run dir>/keys.json, the gateway calls the router with
its own certificate; the control plane speaks mTLS, serves ADS to the router's certificate only
(the router's xDS bootstrap carries it) and its admin service to keys with the admin scope.
Knows files and environment variables only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from mesh.bootstrap import XdsTls
from mesh.topology import listener_name
from services.common.tiers import TIER_NAMES
from services.security.api_keys import create_key, load_keys, revoke_key
from services.security.certs import CA_CERT, DEFAULT_HOSTS, init_ca, issue
from services.security.tls import TlsFiles, channel_credentials

ROUTER_ID = "spiffe://tiermesh/router"
DEMO_KEY_NAME = "tiermesh-run-demo"
SERVICES = ("router", "gateway", "control-plane", "launcher", *(f"tier/{t}" for t in TIER_NAMES))


@dataclass(frozen=True)
class SecureRun:
    certs: Path
    keys_file: Path

    @property
    def ca(self) -> Path:
        return self.certs / CA_CERT

    def files(self, identity: str) -> TlsFiles:
        stem = identity.replace("/", "-")
        return TlsFiles(self.ca, self.certs / f"{stem}.pem", self.certs / f"{stem}-key.pem")

    def env_for(self, child: str) -> dict[str, str]:
        """The environment of the child named `child` (small, small-2, router, gateway, ...)."""
        tier = child.split("-")[0]
        identity = f"tier/{tier}" if tier in TIER_NAMES else child
        files = self.files(identity)
        env = {
            "TIERMESH_TLS_CA": str(files.ca),
            "TIERMESH_TLS_CERT": str(files.cert),
            "TIERMESH_TLS_KEY": str(files.key),
        }
        if tier in TIER_NAMES:  # Generate for the router's certificate; hot swap by admin key
            env["TIERMESH_ALLOWED_CALLERS"] = ROUTER_ID
            env["TIERMESH_KEYS_FILE"] = str(self.keys_file)
        elif child == "router":
            env["TIERMESH_TLS_CLIENT_AUTH"] = "optional"
            env["TIERMESH_KEYS_FILE"] = str(self.keys_file)
        elif child == "control-plane":  # mTLS; ADS for the router only, admin by an admin key
            env["TIERMESH_ALLOWED_CALLERS"] = ROUTER_ID
            env["TIERMESH_KEYS_FILE"] = str(self.keys_file)
        return env

    def router_xds_tls(self) -> XdsTls:
        """The router's ADS stream: mTLS with its own certificate (its xDS bootstrap)."""
        files = self.files("router")
        return XdsTls(files.ca, files.cert, files.key)

    def launcher_credentials(self) -> grpc.ChannelCredentials:
        """mTLS credentials of the launcher's own health checks (health is open to any verified
        peer) and its demo chat."""
        return channel_credentials(self.files("launcher"))

    def demo_key(self) -> str:
        """A fresh chat key for the demo chat (the previous run's is revoked)."""
        if any(k.name == DEMO_KEY_NAME and k.revoked is None for k in load_keys(self.keys_file)):
            revoke_key(self.keys_file, DEMO_KEY_NAME)
        return create_key(self.keys_file, DEMO_KEY_NAME, ("chat",))[1]


def prepare_secure_run(run_dir: Path, hours: float = 24.0) -> SecureRun:
    """Creates the CA once and issues every service's certificate anew (valid `hours`)."""
    certs = run_dir / "certs"
    if not (certs / CA_CERT).exists():
        init_ca(certs)
    for name in SERVICES:
        tier = name.removeprefix("tier/")
        # A tier behind the mesh is dialled as xds:///tier-NAME: its certificate names that
        # host too, or the router's hostname check fails.
        hosts = (*DEFAULT_HOSTS, listener_name(tier)) if tier in TIER_NAMES else DEFAULT_HOSTS
        issue(certs, name, hours=hours, hosts=hosts)
    return SecureRun(certs, run_dir / "keys.json")
