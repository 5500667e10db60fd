"""`python -m services.training models ...`: the models command without the tiermesh CLI.

Only parses arguments and dispatches; the work is in services.training.cli.
"""

from __future__ import annotations

import argparse
import sys

from services.training.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.training")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
