"""Builds the tiermesh.v1 stubs into the wheel: protoc (from grpcio-tools) runs over the contract
in the repository's protos/ folder, so the wheel always carries code generated from it.

TIERMESH_PROTOS names another folder holding tiermesh/v1/*.proto (e.g. for an sdist build).
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def proto_root() -> Path:
    root = Path(os.environ.get("TIERMESH_PROTOS", HERE.parent.parent / "protos"))
    if not list((root / "tiermesh" / "v1").glob("*.proto")):
        raise SystemExit(
            f"tiermesh-client: no tiermesh/v1/*.proto under {root}; build from the repository "
            "checkout or set TIERMESH_PROTOS to the folder holding them"
        )
    return root


class BuildWithStubs(build_py):
    """build_py, then protoc into the build folder (python, grpc and .pyi outputs)."""

    def run(self) -> None:
        super().run()
        from grpc_tools import protoc  # a build requirement, see pyproject.toml

        root = proto_root()
        out = Path(self.build_lib)
        sources = sorted(str(p) for p in (root / "tiermesh" / "v1").glob("*.proto"))
        include = Path(protoc.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("tiermesh-client: protoc failed on " + ", ".join(sources))
        (out / "tiermesh" / "v1" / "__init__.py").touch()


setup(cmdclass={"build_py": BuildWithStubs})
