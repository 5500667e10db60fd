"""A development certificate authority and the certificates it issues to the mesh's services and
clients. Each certificate carries its identity as a SPIFFE-style URI SAN (`spiffe://tiermesh/
router`, `spiffe://tiermesh/tier/small`, `spiffe://tiermesh/client/NAME`), which peers check;
DNS and IP SANs let TLS verify the address it dialled. Every file is written 0600.

Good for a laptop, CI and a cluster without a PKI; a platform with its own (cert-manager,
SPIRE) issues the same shape of certificate and tiermesh reads those files the same way.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.errors import ConfigError

TRUST_DOMAIN = "tiermesh"
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*$")


@dataclass(frozen=True)
class IssuedCertificate:
    identity: str  # spiffe://tiermesh/...
    cert: Path
    key: Path
    not_after: datetime.datetime


def spiffe_id(name: str) -> str:
    """The identity of `name`: "router" -> spiffe://tiermesh/router; a full spiffe:// id is kept."""
    if name.startswith("spiffe://"):
        return name
    if not _NAME.match(name):
        raise ConfigError(
            f"certificate name {name!r}: use lower-case words joined by '/', e.g. router, "
            "tier/small, client/alice"
        )
    return f"spiffe://{TRUST_DOMAIN}/{name}"


def file_stem(name: str) -> str:
    """The file name an identity's certificate is written under: tier/small -> tier-small."""
    return spiffe_id(name).removeprefix(f"spiffe://{TRUST_DOMAIN}/").replace("/", "-")


def _write(path: Path, data: bytes) -> None:
    """Writes 0600 (only the owner reads a key, nor a certificate), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # readers never see half a file: rotation is atomic


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def init_ca(directory: Path, *, days: int = 365, force: bool = False) -> Path:
    """Creates ca.pem and ca-key.pem in `directory`; refuses to replace an existing CA unless
    `force` (every certificate it issued would stop being trusted). Returns ca.pem's path."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and not force:
        raise ConfigError(f"{cert_path}: a CA exists already (use --force to replace it)")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tiermesh development CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key))
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if not cert_path.exists() or not key_path.exists():
        raise ConfigError(f"{directory}: no CA here; run `tiermesh certs init --dir {directory}`")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{key_path}: not an EC private key")
    return cert, key


def issue(
    directory: Path,
    name: str,
    *,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    hours: float = 24.0,
    out: Path | None = None,
    not_before: datetime.datetime | None = None,
) -> IssuedCertificate:
    """Issues a certificate for `name` (router, gateway, control-plane, tier/small, client/N),
    valid `hours` from now, for TLS servers and clients alike, signed by the CA in `directory`.
    Writes <stem>.pem and <stem>-key.pem (0600) into `out` (default: the CA's directory)."""
    identity = spiffe_id(name)
    ca_cert, ca_key = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    not_after = start + datetime.timedelta(hours=hours, minutes=5)
    alt_names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity)]
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    target = out or directory
    stem = file_stem(name)
    key_path, cert_path = target / f"{stem}-key.pem", target / f"{stem}.pem"
    _write(key_path, _key_pem(key))
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return IssuedCertificate(identity, cert_path, key_path, not_after)
