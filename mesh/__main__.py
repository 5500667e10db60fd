"""Entrypoint of the control plane and its tools: `python -m mesh serve --topology FILE`."""

import sys

from mesh.cli import main

sys.exit(main())
