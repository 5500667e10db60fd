"""Loads a causal LM from a local Hugging Face folder onto a torch device, with its tokenizer.

The torch half of loading: the tokenizer, prompt rendering and detokenizing are in
tokenizer_loading.py, which imports no torch. Never touches a model hub: every load passes
local_files_only. Knows nothing of gRPC.

Two ways to read the weights (`WEIGHTS_LOADING`): "eager", transformers' `from_pretrained`,
which builds the model and copies every tensor out of the safetensors files; and "lazy", which
builds the model without initialising its weights and assigns tensors memory-mapped from the
files (`safetensors.safe_open`), so a weight costs no copy and its pages are read when first
used. Both give the same model (same tensors, same buffers, tied weights tied).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.tier.tokenizer_loading import eos_token_ids, load_tokenizer

REQUIRED_FILES = ("config.json", "tokenizer.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS_LOADING = ("lazy", "eager")


class ModelFolderError(ValueError):
    """The model folder is missing or incomplete; the message says which file and where."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for decoding, with what the engine needs to know about it."""

    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # a transformers PreTrainedTokenizerFast
    name: str  # the folder's name
    device: torch.device
    eos_token_ids: frozenset[int]
    context_length: int  # most positions the model can attend over (prompt + generated)
    params: int
    weights_bytes: int


def check_model_folder(path: Path) -> None:
    """Raises ModelFolderError naming what is missing from a Hugging Face model folder."""
    if not path.is_dir():
        raise ModelFolderError(f"model folder {path} does not exist")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ModelFolderError(f"model folder {path} lacks {', '.join(missing)}")


def imported_dtype(path: Path) -> str | None:
    """The dtype a folder written by `tiermesh models import` was written in (its tiermesh.json),
    chosen at import as the one to serve it in; None for any other folder."""
    origin = path / "tiermesh.json"
    if not origin.is_file():
        return None
    try:
        record = json.loads(origin.read_text())
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{origin}: not valid JSON: {e}") from None
    dtype = record.get("dtype") if isinstance(record, dict) else None
    return dtype if isinstance(dtype, str) else None


def import_model_code(path: Path) -> None:
    """Imports transformers and the model class the folder's config names (its first import
    costs seconds), so that a timed load measures reading the weights only."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    check_model_folder(path)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # the lazy mapping imports the class's module


def _load_lazy(path: Path, dtype: torch.dtype) -> Any:
    """Builds the model with uninitialised weights, then assigns tensors memory-mapped from the
    folder's safetensors files (a copy only where the dtype differs), and ties tied weights."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    with no_init_weights():
        model: Any = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key in expected:
                    state[key] = weights.get_tensor(key).to(dtype)
    missing = [key for key in expected if key not in state]
    tied = _tied_keys(model)
    untied_missing = [key for key in missing if key not in tied]
    if untied_missing:
        raise ModelFolderError(
            f"model folder {path}: the safetensors lack {', '.join(untied_missing[:5])}"
        )
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    return model


def _tied_keys(model: Any) -> set[str]:
    """The state-dict keys that are ties to another weight (absent from a saved checkpoint)."""
    keys = getattr(model, "all_tied_weights_keys", None) or getattr(
        model, "_tied_weights_keys", None
    )
    if isinstance(keys, dict):
        return set(keys)
    return set(keys or ())


def load_causal_lm(
    path: Path, device: str = "cpu", dtype: str = "float32", loading: str = "lazy"
) -> LoadedModel:
    """Loads the model and tokenizer in `path` onto `device` with weights in `dtype`, reading
    the weights `loading` ("lazy" or "eager": a tier's `weights_loading`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # a per-tensor progress bar for a load of well under a second is noise in service logs and in
    # every tool that loads the tiers (eval, labelling)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    check_model_folder(path)
    if dtype not in DTYPES:
        raise ModelFolderError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelFolderError(f"device {device!r} requested but CUDA is not available")
    if loading not in WEIGHTS_LOADING:
        raise ModelFolderError(f"weights_loading {loading!r} is not one of lazy, eager")
    tokenizer = load_tokenizer(path)
    model: Any
    if loading == "lazy":
        model = _load_lazy(path, DTYPES[dtype])
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=DTYPES[dtype]
        )
    model.to(device)
    model.eval()
    config = json.loads((path / "config.json").read_text())
    context = int(config.get("n_positions") or config.get("max_position_embeddings") or 1024)
    params = sum(p.numel() for p in model.parameters())
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=path.resolve().name if path.name != "model" else path.resolve().parent.name,
        device=torch.device(device),
        eos_token_ids=eos_token_ids(path, tokenizer),
        context_length=context,
        params=params,
        weights_bytes=weights_bytes,
    )
