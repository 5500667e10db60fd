"""TLS in the Kubernetes manifests (`tiermesh mesh k8s --secure`): each Deployment mounts its
identity's certificate and the CA read-only from Secrets and reads them through TIERMESH_TLS_*;
tiers and the control plane accept ADS/Generate only from the router's identity; the router, the
control plane and the tiers' admin service (hot swap) enforce the API keys of a Secret; gRPC
containers are probed by an exec probe that checks gRPC health over mTLS (kubelet's native
`grpc:` probe speaks plaintext only).

The Secrets are referenced, never written with keys in them: `secret_commands` lists the
`tiermesh certs issue` and `kubectl create secret` commands that make them. Plain dictionaries;
knows nothing of serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mesh.bootstrap import XdsTls
from mesh.topology import Topology, listener_name

TLS_MOUNT = "/etc/tiermesh/tls"
KEYS_MOUNT = "/etc/tiermesh/keys"
CA_SECRET = "tiermesh-ca"
KEYS_SECRET = "tiermesh-api-keys"
ROUTER_ID = "spiffe://tiermesh/router"
# An exec probe starts a Python process (~0.3 s of CPU here), so the secure pods are probed
# every 10 s instead of 5 (startup keeps 5 s: it runs only until the service is up).
SECURE_PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 5
ROLES = ("tier", "router", "control-plane", "gateway")
# who reads the API keys: the router's clients, the control plane's admin service, and a tier's
# admin service (an operator's hot swap: a certificate of the CA plus an admin key)
KEYED_ROLES = ("router", "control-plane", "tier")


def tls_secret(identity: str) -> str:
    """The kubernetes.io/tls Secret of an identity: tier/small -> tiermesh-tls-tier-small."""
    return f"tiermesh-tls-{identity.replace('/', '-')}"


def mounted_tls() -> XdsTls:
    """The CA, certificate and key as every secure pod sees them."""
    mount = Path(TLS_MOUNT)
    return XdsTls(mount / "ca.crt", mount / "tls.crt", mount / "tls.key")


def _env(role: str) -> dict[str, str]:
    files = mounted_tls()
    env = {
        "TIERMESH_TLS_CA": str(files.ca),
        "TIERMESH_TLS_CERT": str(files.cert),
        "TIERMESH_TLS_KEY": str(files.key),
    }
    if role in ("tier", "control-plane"):  # Generate / ADS only from the router
        env["TIERMESH_ALLOWED_CALLERS"] = ROUTER_ID
    if role == "router":  # clients outside the mesh bring a key, not a certificate
        env["TIERMESH_TLS_CLIENT_AUTH"] = "optional"
    if role in KEYED_ROLES:
        env["TIERMESH_KEYS_FILE"] = f"{KEYS_MOUNT}/keys.json"
    return env


def _exec_probe(probe: dict[str, Any], port: int) -> dict[str, Any]:
    """`probe` (a native grpc probe) as an exec probe that checks health over mTLS."""
    command = ["python", "-m", "services.security.health_probe", "--port", str(port)]
    exec_probe = {key: value for key, value in probe.items() if key != "grpc"}
    return {"exec": {"command": command}, **exec_probe, "timeoutSeconds": PROBE_TIMEOUT_S}


def secure_container(container: dict[str, Any], identity: str, role: str) -> list[dict[str, Any]]:
    """Turns TLS on in `container` (in place): its environment, read-only mounts and, for a
    gRPC container, exec probes. Returns the volumes its pod needs."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {ROLES}")
    env = container.setdefault("env", [])
    env += [{"name": name, "value": value} for name, value in _env(role).items()]
    mounts = container.setdefault("volumeMounts", [])
    mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    volumes: list[dict[str, Any]] = [
        {
            "name": "tls",
            "projected": {
                "defaultMode": 0o440,  # owner root, group fsGroup (the service's user)
                "sources": [
                    {
                        "secret": {
                            "name": tls_secret(identity),
                            "items": [
                                {"key": "tls.crt", "path": "tls.crt"},
                                {"key": "tls.key", "path": "tls.key"},
                            ],
                        }
                    },
                    {
                        "secret": {
                            "name": CA_SECRET,
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                ],
            },
        }
    ]
    if role in KEYED_ROLES:
        mounts.append({"name": "api-keys", "mountPath": KEYS_MOUNT, "readOnly": True})
        volumes.append(
            {"name": "api-keys", "secret": {"secretName": KEYS_SECRET, "defaultMode": 0o440}}
        )
    if role != "gateway":  # the gateway's HTTP probes stay (browsers' TLS is the ingress's)
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "grpc" not in container.get(name, {}):
                continue  # none, or an exec probe already (it reads the TLS settings above)
            probe = _exec_probe(container[name], container[name]["grpc"]["port"])
            if name != "startupProbe":
                probe["periodSeconds"] = SECURE_PROBE_PERIOD_S
            container[name] = probe
    return volumes


def identities(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Every identity a secure mesh needs, with the host names its certificate must carry:
    its Service's DNS names (what clients dial and check), the tier's xds:/// listener name
    (the router dials xds:///tier-NAME), and localhost (the exec probe)."""
    namespace = topology.kubernetes.namespace

    def service(name: str) -> tuple[str, ...]:
        return (name, f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")

    names: dict[str, tuple[str, ...]] = {
        "router": service("tiermesh-router"),
        "control-plane": service("tiermesh-control-plane"),
        "gateway": (),
    }
    for tier in topology.tiers:
        names[f"tier/{tier.name}"] = (listener_name(tier.name), *service(f"tier-{tier.name}"))
    return {
        identity: tuple(dict.fromkeys((*hosts, "localhost"))) for identity, hosts in names.items()
    }


def secret_commands(topology: Topology, cert_dir: str = "certs", hours: int = 720) -> list[str]:
    """The shell commands that create every Secret the secure manifests mount, from a CA in
    `cert_dir` (`tiermesh certs init --dir certs`): no private key is ever in the manifests."""
    namespace = topology.kubernetes.namespace
    lines = [
        f"tiermesh certs init --dir {cert_dir}   # once; or your own CA (cert-manager, ...)",
        f"kubectl -n {namespace} create secret generic {CA_SECRET} "
        f"--from-file=ca.crt={cert_dir}/ca.pem",
    ]
    for identity, hosts in identities(topology).items():
        stem = identity.replace("/", "-")
        flags = " ".join(f"--host {host}" for host in hosts)
        lines.append(f"tiermesh certs issue {identity} --dir {cert_dir} --hours {hours} {flags}")
        lines.append(
            f"kubectl -n {namespace} create secret tls {tls_secret(identity)} "
            f"--cert={cert_dir}/{stem}.pem --key={cert_dir}/{stem}-key.pem"
        )
    lines.append("tiermesh keys create --name app --scopes chat --file keys.json   # hashed")
    lines.append(
        f"kubectl -n {namespace} create secret generic {KEYS_SECRET} --from-file=keys.json"
    )
    return lines
