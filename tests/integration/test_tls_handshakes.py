"""mTLS with real handshakes on loopback: certificates from `services.security.certs`, server
credentials that reload rotated files, and the caller check by SPIFFE ID. The server under test
is a real grpc.aio server with a minimal TierService servicer (named as such below): what is
tested is the transport and the identity check, not the tier."""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.security.certs import init_ca, issue
from services.security.tls import (
    AllowedCallers,
    RotatingCertificates,
    TlsFiles,
    channel_credentials,
    server_credentials,
)

ROUTER = "spiffe://tiermesh/router"


class MinimalTierServicer(tier_pb2_grpc.TierServiceServicer):
    """Answers GetStatus and streams WatchLoad every 20 ms: enough to carry calls over TLS."""

    async def GetStatus(self, request, context):
        return tier_pb2.TierStatus(tier="small")

    async def WatchLoad(self, request, context):
        for n in range(1000):
            yield tier_pb2.TierStatus(tier="small", running=n)
            await asyncio.sleep(0.02)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca")
    for name in ("tier/small", "router", "gateway"):
        issue(tmp_path / "ca", name)
    return tmp_path / "ca"


async def _serve(pki: Path, allowed: tuple[str, ...] = (ROUTER,)) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[AllowedCallers(allowed)])
    tier_pb2_grpc.add_TierServiceServicer_to_server(MinimalTierServicer(), server)
    files = TlsFiles(pki / "ca.pem", pki / "tier-small.pem", pki / "tier-small-key.pem")
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(files, require_client_auth=True)
    )
    await server.start()
    return server, port


def _client(port: int, pki: Path, cert: str | None) -> grpc.aio.Channel:
    files = TlsFiles(
        pki / "ca.pem",
        pki / f"{cert}.pem" if cert else None,
        pki / f"{cert}-key.pem" if cert else None,
    )
    return grpc.aio.secure_channel(f"localhost:{port}", channel_credentials(files))


@pytest.fixture
async def server(pki: Path) -> AsyncIterator[int]:
    server, port = await _serve(pki)
    yield port
    await server.stop(0)


async def _status(channel: grpc.aio.Channel) -> tier_pb2.TierStatus:
    async with channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)


def test_files_are_written_owner_only(pki: Path) -> None:
    for path in pki.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path


async def test_the_router_identity_is_served(server: int, pki: Path) -> None:
    assert (await _status(_client(server, pki, "router"))).tier == "small"


async def test_another_identity_is_denied_by_name(server: int, pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _status(_client(server, pki, "gateway"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://tiermesh/gateway may not call" in (refused.value.details() or "")


async def test_a_client_without_certificate_cannot_connect(server: int, pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _status(_client(server, pki, None))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_from_another_ca_is_refused(
    server: int, pki: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca"
    init_ca(other)
    issue(other, "router")
    files = TlsFiles(pki / "ca.pem", other / "router.pem", other / "router-key.pem")
    channel = grpc.aio.secure_channel(f"localhost:{server}", channel_credentials(files))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _status(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_an_expired_certificate_is_refused(server: int, pki: Path, tmp_path: Path) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    issue(pki, "router", hours=1, out=tmp_path / "expired", not_before=past)
    files = TlsFiles(
        pki / "ca.pem", tmp_path / "expired" / "router.pem", tmp_path / "expired" / "router-key.pem"
    )
    channel = grpc.aio.secure_channel(f"localhost:{server}", channel_credentials(files))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _status(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_to_a_secure_port_gets_no_answer(server: int) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _status(grpc.aio.insecure_channel(f"localhost:{server}"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_rotation_mid_stream_keeps_the_stream(server: int, pki: Path) -> None:
    """New files under the server: the open stream goes on, new handshakes use them."""
    channel = _client(server, pki, "router")
    stub = tier_pb2_grpc.TierServiceStub(channel)
    stream = stub.WatchLoad(tier_pb2.WatchLoadRequest(), timeout=30)
    seen = []
    async for status in stream:
        seen.append(status.running)
        if len(seen) == 5:
            before = (pki / "tier-small.pem").read_bytes()
            issue(pki, "tier/small")  # rotate: a new key and certificate
            assert (pki / "tier-small.pem").read_bytes() != before
            assert (await _status(_client(server, pki, "router"))).tier == "small"
            served = await asyncio.to_thread(_served_certificate, server, pki)
            assert served == _der(pki / "tier-small.pem")  # the new one, on a new handshake
        if len(seen) == 15:
            break
    stream.cancel()
    await channel.close()
    assert seen == list(range(15))  # not a message lost or repeated across the rotation


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def _served_certificate(port: int, pki: Path) -> bytes:
    """The certificate the server presents to a new TLS handshake (Python's ssl, as a router)."""
    context = ssl.create_default_context(cafile=pki / "ca.pem")
    context.load_cert_chain(pki / "router.pem", pki / "router-key.pem")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("localhost", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def test_rotating_certificates_reloads_only_on_change(pki: Path) -> None:
    files = TlsFiles(pki / "ca.pem", pki / "tier-small.pem", pki / "tier-small-key.pem")
    fetch = RotatingCertificates(files, require_client_auth=True)
    assert fetch() is None
    issue(pki, "tier/small")
    stamp = (pki / "tier-small.pem").stat().st_mtime_ns + 1_000_000
    os.utime(pki / "tier-small.pem", ns=(stamp, stamp))
    assert fetch() is not None and fetch.rotations == 1
    assert fetch() is None
