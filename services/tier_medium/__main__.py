"""Entrypoint of the medium tier: the shared tier server with this folder's config.toml."""

import sys
from pathlib import Path

from services.tier.server import main

sys.exit(main(Path(__file__).with_name("config.toml")))
