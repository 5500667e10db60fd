"""`tiermesh models import`: turns a real checkpoint into a tier model folder.

Sources: a GGUF file, an installed Python package that ships one (`--from-package`), or a
Hugging Face folder. The output is what a tier loads: config.json, safetensors in the chosen
dtype, the tokenizer with the model's own chat template, generation_config.json, and
tiermesh.json recording the origin (source, its sha256, dtype, parameter count). GGUF weights
are dequantised by transformers (needs the `models` extra: gguf, accelerate) and written through
a plain model built from the config, since transformers will not save a GGUF-loaded one.
Never touches a model hub. Knows nothing of serving or gRPC.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.common.cpu_features import cpu_flags, fastest_cpu_dtype
from services.common.extras import MissingExtra

ORIGIN_FILE = "tiermesh.json"
DTYPES = ("float32", "bfloat16")
DEFAULT_DTYPE = "float32"
AUTO_DTYPE = "auto"  # the CLI's default: the fastest dtype on this machine's CPU (cpu_features)


class ImportFailed(ValueError):
    """The source cannot be imported; the message says what was wrong and where."""


class MissingModelsExtra(MissingExtra):
    """Reading GGUF files needs the `models` extra."""

    def __init__(self, module: str) -> None:
        ImportError.__init__(
            self,
            f"reading a GGUF file needs {module}, which is not installed: "
            "pip install 'tiermesh[models]'",
        )


@dataclass(frozen=True)
class ModelOrigin:
    """What tiermesh.json records about an imported model."""

    source: str  # the file or folder imported
    source_format: str  # "gguf" or "hf"
    source_sha256: str  # of the GGUF file; of the weight files in name order for a folder
    package: str  # "name==version" when it came from --from-package, else ""
    architecture: str  # the config's model_type
    dtype: str  # of the written safetensors
    params: int
    context_length: int
    chat_template: bool  # the tokenizer carries its own chat template
    imported_at: str  # UTC, ISO 8601
    dtype_choice: str = ""  # why `dtype`: "asked", or "auto: <what the CPU computes natively>"


def package_gguf(package: str) -> tuple[Path, str]:
    """The GGUF file an installed distribution ships, and "name==version"."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ImportFailed(f"--from-package: {package!r} is not installed") from None
    files = sorted(Path(str(dist.locate_file(f))) for f in dist.files or [] if f.suffix == ".gguf")
    if not files:
        raise ImportFailed(f"--from-package: {package} {dist.version} ships no .gguf file")
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ImportFailed(f"--from-package: {package} ships several .gguf files ({names})")
    return files[0], f"{dist.metadata['Name']}=={dist.version}"


def sha256_of(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as source:
            while block := source.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) from a GGUF file, dequantised to float32, as a plain model."""
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise MissingModelsExtra(module)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def _load_folder(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ImportFailed(f"{path}: not a Hugging Face model folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


def import_model(
    source: Path,
    out: Path,
    dtype: str = DEFAULT_DTYPE,
    package: str = "",
    dtype_choice: str = "asked",
) -> ModelOrigin:
    """Writes the tier model folder `out` from `source` (a .gguf file or an HF folder);
    `dtype_choice` is recorded as why the dtype is what it is."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if dtype not in DTYPES:
        raise ImportFailed(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if out.exists() and any(out.iterdir()):
        raise ImportFailed(f"--out: {out} exists and is not empty")
    if source.is_file() and source.suffix == ".gguf":
        source_format, weights = "gguf", [source]
        model, tokenizer = _load_gguf(source)
    elif source.is_dir():
        source_format = "hf"
        weights = sorted(source.glob("*.safetensors")) or sorted(source.glob("*.bin"))
        model, tokenizer = _load_folder(source)
    else:
        raise ImportFailed(f"{source}: neither a .gguf file nor a model folder")
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(getattr(torch, dtype)).eval()
    model.config.dtype = dtype
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config = model.config
    origin = ModelOrigin(
        source=str(source.resolve()),
        source_format=source_format,
        source_sha256=sha256_of(weights),
        package=package,
        architecture=str(config.model_type),
        dtype=dtype,
        params=sum(p.numel() for p in model.parameters()),
        context_length=int(getattr(config, "max_position_embeddings", 0) or 0),
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
        imported_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        dtype_choice=dtype_choice,
    )
    (out / ORIGIN_FILE).write_text(json.dumps(asdict(origin), indent=2) + "\n")
    return origin


def register(models: Any) -> None:
    """Adds `import` to the `models` subparsers object."""
    parser = models.add_parser(
        "import", help="turn a GGUF file, a package shipping one, or an HF folder into a tier model"
    )
    parser.add_argument("source", nargs="?", type=Path, help="a .gguf file or an HF model folder")
    parser.add_argument("--from-package", metavar="NAME", help="an installed package's .gguf file")
    parser.add_argument("--out", type=Path, required=True, help="the tier model folder to write")
    parser.add_argument(
        "--dtype",
        choices=(AUTO_DTYPE, *DTYPES),
        default=AUTO_DTYPE,
        help="weights' dtype; auto (the default): bfloat16 where this CPU computes it natively "
        "(avx512_bf16, amx_bf16), else float32",
    )
    parser.add_argument("--json", action="store_true", help="print tiermesh.json's record last")
    parser.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    if (args.source is None) == (args.from_package is None):
        print("models import: give SOURCE or --from-package NAME (one of them)", file=sys.stderr)
        return 2
    try:
        package = ""
        source = args.source
        if args.from_package is not None:
            source, package = package_gguf(args.from_package)
        dtype, choice = args.dtype, "asked"
        if dtype == AUTO_DTYPE:
            dtype, why = fastest_cpu_dtype(cpu_flags())
            choice = f"auto: {why}"
        print(f"importing {source} -> {args.out} ({dtype}; {choice})", file=sys.stderr)
        started = time.perf_counter()
        origin = import_model(source, args.out, dtype, package, choice)
    except ImportFailed as e:
        print(f"models import: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.out}: {origin.architecture}, {origin.params / 1e6:.1f}M parameters, "
        f"{origin.dtype}, context {origin.context_length}, "
        f"chat template {'yes' if origin.chat_template else 'no'} "
        f"({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(asdict(origin)))
    return 0
