"""`python -m services.cli` is the `tiermesh` command."""

import sys

from services.cli.main import main

sys.exit(main())
