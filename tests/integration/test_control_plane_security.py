"""The control plane secured: ADS over TLS to grpcio's own proxyless xDS client (its bootstrap's
gRFC A65 `tls` channel credentials, mTLS with the router's certificate), ADS refused to other
certificates and to plaintext, and the mesh admin service open only to API keys with the admin
scope. Real handshakes: the control plane in-process, the xDS client in a child process
(`python -m mesh probe`, as grpc reads its bootstrap once per process), a real backend."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from mesh.admin import fetch_status
from mesh.bootstrap import XdsTls, bootstrap_env, bootstrap_problems
from mesh.control_plane import RunningControlPlane, start_control_plane
from mesh.node_status import ACKED
from services.security.api_keys import create_key
from services.security.certs import init_ca, issue
from services.security.settings import ServiceSecurity
from services.security.tls import TlsFiles, channel_credentials
from tests.integration.test_mesh_xds import TARGET, run_mesh_cli, start_backend, topology_text

ROUTER_ID = "spiffe://tiermesh/router"


@dataclass
class SecurePlane:
    plane: RunningControlPlane
    pki: Path
    chat_key: str
    admin_key: str

    def xds_tls(self, stem: str | None) -> XdsTls:
        ca = self.pki / "ca.pem"
        if stem is None:
            return XdsTls(ca)
        return XdsTls(ca, self.pki / f"{stem}.pem", self.pki / f"{stem}-key.pem")

    def files(self, stem: str) -> TlsFiles:
        return TlsFiles(self.pki / "ca.pem", self.pki / f"{stem}.pem", self.pki / f"{stem}-key.pem")

    async def status(self, api_key: str | None) -> grpc.StatusCode:
        """GetMeshStatus (a blocking client, in a thread) with an operator's certificate (any
        the CA signed) and `api_key`."""
        credentials = channel_credentials(self.files("client-ops"))
        try:
            await asyncio.to_thread(fetch_status, self.plane.address, 5.0, credentials, api_key)
        except grpc.RpcError as e:
            return e.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK


@pytest.fixture
async def secure_plane(tmp_path: Path) -> AsyncIterator[SecurePlane]:
    pki = tmp_path / "certs"
    init_ca(pki)
    for name in ("control-plane", "router", "gateway", "client/ops"):
        issue(pki, name)
    keys = tmp_path / "keys.json"
    _, chat_key = create_key(keys, "app", ("chat",))
    _, admin_key = create_key(keys, "ops", ("admin",))
    backend = await start_backend("a")
    topology = tmp_path / "topology.yaml"
    topology.write_text(topology_text([("large-v1", 1, [backend.port])]))
    security = ServiceSecurity(
        TlsFiles(pki / "ca.pem", pki / "control-plane.pem", pki / "control-plane-key.pem"),
        allowed_callers=(ROUTER_ID,),
        keys_file=keys,
    )
    plane = await start_control_plane(topology, security=security)
    yield SecurePlane(plane, pki, chat_key, admin_key)
    await plane.stop()
    await backend.server.stop(0)


async def probe(plane: SecurePlane, node_id: str, tls: XdsTls | None) -> dict[str, int]:
    code, out, err = await run_mesh_cli(
        "probe", TARGET, "--calls", "3", env=bootstrap_env(plane.plane.address, node_id, tls)
    )
    assert code == 0, err
    counts: dict[str, int] = json.loads(out)["counts"]
    return counts


async def test_grpc_xds_client_gets_its_config_over_mtls(secure_plane: SecurePlane) -> None:
    counts = await probe(secure_plane, "router~mtls", secure_plane.xds_tls("router"))
    assert counts == {"a": 3}
    (node,) = [n for n in secure_plane.plane.plane.book.nodes() if n.node_id == "router~mtls"]
    assert {record.state for record in node.types.values()} == {ACKED}


async def test_ads_refuses_plaintext_another_identity_and_no_certificate(
    secure_plane: SecurePlane,
) -> None:
    for node_id, tls in (
        ("plain", None),
        ("gateway", secure_plane.xds_tls("gateway")),
        ("anonymous", secure_plane.xds_tls(None)),
    ):
        counts = await probe(secure_plane, node_id, tls)
        assert "a" not in counts and sum(counts.values()) == 3, (node_id, counts)
    assert [n.node_id for n in secure_plane.plane.plane.book.nodes()] == []


async def test_admin_status_needs_the_admin_scope(secure_plane: SecurePlane) -> None:
    chat, admin = secure_plane.chat_key, secure_plane.admin_key
    assert await secure_plane.status(None) == grpc.StatusCode.UNAUTHENTICATED
    assert await secure_plane.status("tmk_bogus_key") == grpc.StatusCode.UNAUTHENTICATED
    assert await secure_plane.status(chat) == grpc.StatusCode.PERMISSION_DENIED
    assert await secure_plane.status(admin) == grpc.StatusCode.OK


async def test_mesh_status_command_over_tls_with_an_admin_key(secure_plane: SecurePlane) -> None:
    admin = secure_plane.admin_key
    files = secure_plane.files("client-ops")
    tls = ("--ca", str(files.ca), "--cert", str(files.cert), "--key", str(files.key))
    address = ("--address", secure_plane.plane.address)
    code, out, err = await run_mesh_cli("status", "--json", *address, *tls, "--api-key", admin)
    assert code == 0, err
    assert json.loads(out)["clusters"][0]["cluster"] == "large-v1"
    code, _, err = await run_mesh_cli("status", *address, *tls)
    assert code == 1 and "UNAUTHENTICATED" in err


async def test_bootstrap_command_writes_a_valid_tls_bootstrap(tmp_path: Path) -> None:
    pki = tmp_path / "certs"
    code, out, err = await run_mesh_cli(
        "bootstrap",
        "--control-plane",
        "127.0.0.1:50081",
        *("--ca", str(pki / "ca.pem"), "--cert", str(pki / "r.pem"), "--key", str(pki / "k.pem")),
    )
    assert code == 0, err
    bootstrap = json.loads(out)
    assert bootstrap_problems(bootstrap) == []
    (creds,) = bootstrap["xds_servers"][0]["channel_creds"]
    assert creds["type"] == "tls"
    assert creds["config"]["ca_certificate_file"] == str((pki / "ca.pem").resolve())
    assert creds["config"]["certificate_file"] == str((pki / "r.pem").resolve())


async def test_the_exec_health_probe_speaks_mtls(secure_plane: SecurePlane) -> None:
    """The secure manifests' exec probe, against a real TLS server that only serves ADS to the
    router: health answers any certificate of the CA (here an operator's), not plaintext."""
    port = str(secure_plane.plane.port)
    ops = secure_plane.files("client-ops")
    tls = {
        "TIERMESH_TLS_CA": str(ops.ca),
        "TIERMESH_TLS_CERT": str(ops.cert),
        "TIERMESH_TLS_KEY": str(ops.key),
    }
    for env, expected in ((tls, 0), ({}, 1)):
        plain = {k: v for k, v in os.environ.items() if not k.startswith("TIERMESH_TLS")}
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.security.health_probe", "--port", port),
            env={**plain, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == expected, (out, err)
