"""The images' recipes stay in step with the tree: every path a Dockerfile copies exists, the
vLLM tier image installs the same requirements `make setup-vllm` does, and they parse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.vllm"])
def test_every_copied_path_exists(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    sources = [
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.MULTILINE)
        for source in line.split()[:-1]
    ]
    assert sources
    missing = [source for source in sources if not (ROOT / source).exists()]
    assert missing == [], f"{dockerfile} copies what the tree does not have: {missing}"


def test_the_vllm_tier_requirements_parse_and_both_installs_use_them() -> None:
    lines = (ROOT / "requirements/vllm-tier.txt").read_text().splitlines()
    names = {Requirement(line).name for line in lines if line and not line.startswith("#")}
    assert {"grpcio", "protobuf", "opentelemetry-sdk"} <= names
    assert "torch" not in names and "transformers" not in names  # vLLM's own stay
    assert "-r requirements/vllm-tier.txt" in (ROOT / "Makefile").read_text()
    assert "-r requirements/vllm-tier.txt" in (ROOT / "Dockerfile.vllm").read_text()
