"""Entrypoint of the router: `python -m services.router [--config FILE]`."""

import sys

from services.router.server import main

sys.exit(main())
