"""`python -m services.tier.vllm_server --config TIER.toml`: a tier on vLLM, started from a
spawn-safe entry (vLLM spawns its engine core process, which imports this module again as
`__mp_main__`: nothing runs then but asking Linux to stop that process when the tier's dies,
so a tier killed with SIGKILL leaves no engine core holding its model's memory). The launcher
starts it with the interpreter of `.venv-vllm`.
"""

from __future__ import annotations

import sys
from pathlib import Path


def run() -> int:
    from services.tier.server import main

    return main(Path(__file__).resolve().parents[1] / "tier_large" / "config.toml")


if __name__ == "__main__":
    sys.exit(run())
elif __name__ == "__mp_main__":  # vLLM's engine core: the tier named itself its parent to watch
    from services.common.parent_watch import stop_with_parent

    stop_with_parent()
