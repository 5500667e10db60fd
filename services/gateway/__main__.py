"""Entrypoint of the HTTP gateway: `python -m services.gateway [--config FILE]`."""

import sys

from services.gateway.server import main

sys.exit(main())
