"""The flags every client command takes to reach a secure mesh: an API key and TLS files."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_client_security_flags(parser: argparse.ArgumentParser, talks_to: str) -> None:
    """--api-key, --ca, --cert and --key; `talks_to` says what --ca makes TLS ("the router")."""
    parser.add_argument("--api-key", help="API key (default $TIERMESH_API_KEY)")
    parser.add_argument("--ca", type=Path, help=f"CA file: talk TLS to {talks_to}")
    parser.add_argument("--cert", type=Path, help="client certificate (mTLS), with --key")
    parser.add_argument("--key", type=Path, help="the client certificate's key")
