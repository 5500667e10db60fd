"""`tiermesh certs init|issue` and `tiermesh keys create|list|revoke`: the files the secure mesh
reads (a development CA and service certificates; the hashed API key file)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from services.common import env
from services.common.errors import ConfigError

DEFAULT_CERT_DIR = "certs"
KEYS_FILE_ENV = "TIERMESH_KEYS_FILE"


def default_cert_dir() -> Path:
    return Path(env.run_dir()) / DEFAULT_CERT_DIR


def default_keys_file() -> Path:
    return Path(os.environ.get(KEYS_FILE_ENV) or Path(env.run_dir()) / "keys.json")


def _fail(command: str, error: Exception) -> int:
    print(f"tiermesh {command}: {error}", file=sys.stderr)
    return 2


def cmd_certs_init(args: argparse.Namespace) -> int:
    from services.security.certs import init_ca

    try:
        path = init_ca(args.dir, days=args.days, force=args.force)
    except ConfigError as e:
        return _fail("certs init", e)
    print(f"CA written: {path} (key {args.dir / 'ca-key.pem'}, mode 0600), valid {args.days} days")
    return 0


def cmd_certs_issue(args: argparse.Namespace) -> int:
    from services.security.certs import DEFAULT_HOSTS, issue

    hosts = tuple(args.host) if args.host else DEFAULT_HOSTS
    try:
        issued = issue(args.dir, args.name, hosts=hosts, hours=args.hours, out=args.out)
    except ConfigError as e:
        return _fail("certs issue", e)
    print(f"{issued.identity}: {issued.cert} (key {issued.key}), valid until {issued.not_after}")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from services.security.api_keys import create_key

    scopes = tuple(s.strip() for s in args.scopes.split(",") if s.strip())
    try:
        record, key = create_key(
            args.file, args.name, scopes, args.rpm, args.tpm, args.max_priority
        )
    except ConfigError as e:
        return _fail("keys create", e)
    if args.json:
        print(json.dumps({"id": record.id, "name": record.name, "key": key}))
    else:
        print(key)
        print(
            f"key {record.name!r} (id {record.id}, scopes {','.join(record.scopes)}) added to "
            f"{args.file}; shown once, store it now",
            file=sys.stderr,
        )
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from services.security.api_keys import describe, load_keys

    try:
        rows = describe(load_keys(args.file))
    except ConfigError as e:
        return _fail("keys list", e)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        state = f"revoked {row['revoked']}" if row["revoked"] else "live"
        limits = f"rpm {row['rpm'] or '-'} tpm {row['tpm'] or '-'}"
        print(f"{row['id']}  {row['name']:<16} {','.join(row['scopes']):<20} {limits}  {state}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from services.security.api_keys import revoke_key

    try:
        record = revoke_key(args.file, args.key)
    except ConfigError as e:
        return _fail("keys revoke", e)
    print(f"key {record.name!r} (id {record.id}) revoked")
    return 0


def register(commands: Any) -> None:
    certs = commands.add_parser("certs", help="development CA and service certificates (mTLS)")
    kinds = certs.add_subparsers(dest="certs_command", required=True, metavar="KIND")
    init = kinds.add_parser("init", help="create a development CA")
    init.add_argument("--dir", type=Path, default=default_cert_dir(), help="where the CA lives")
    init.add_argument("--days", type=int, default=365, help="how long the CA is valid")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(func=cmd_certs_init)
    issue = kinds.add_parser(
        "issue", help="a certificate for NAME: router, gateway, control-plane, tier/small, client/N"
    )
    issue.add_argument("name", help="the identity: spiffe://tiermesh/NAME")
    issue.add_argument("--dir", type=Path, default=default_cert_dir(), help="the CA's folder")
    issue.add_argument("--out", type=Path, help="where to write it (default: the CA's folder)")
    issue.add_argument("--hours", type=float, default=24.0, help="validity (short-lived: 24 h)")
    issue.add_argument(
        "--host", action="append", help="DNS name or IP it serves (repeat; default localhost)"
    )
    issue.set_defaults(func=cmd_certs_issue)

    keys = commands.add_parser("keys", help="API keys: create, list, revoke")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    file_help = f"the key file (default ${KEYS_FILE_ENV} or <run dir>/keys.json)"
    create = actions.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True, help="who the key is for")
    create.add_argument("--scopes", default="chat", help="comma list of chat, feedback, admin")
    create.add_argument("--rpm", type=int, help="requests per minute (default: unlimited)")
    create.add_argument("--tpm", type=int, help="tokens per minute (default: unlimited)")
    create.add_argument(
        "--max-priority",
        choices=("batch", "interactive", "critical"),
        help="the highest chat priority the key may ask for (default: any)",
    )
    create.add_argument("--json", action="store_true", help='print {"id", "name", "key"}')
    create.add_argument("--file", type=Path, default=default_keys_file(), help=file_help)
    create.set_defaults(func=cmd_keys_create)
    listing = actions.add_parser("list", help="the keys (never their secrets)")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--file", type=Path, default=default_keys_file(), help=file_help)
    listing.set_defaults(func=cmd_keys_list)
    revoke = actions.add_parser("revoke", help="revoke a key by name or id")
    revoke.add_argument("key", help="its name or id")
    revoke.add_argument("--file", type=Path, default=default_keys_file(), help=file_help)
    revoke.set_defaults(func=cmd_keys_revoke)
