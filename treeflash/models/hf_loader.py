"""Open a Hugging Face model directory: config.json + safetensors (single file or sharded).

Only safetensors are read (never pickled .bin files). Vision-language checkpoints (Qwen3.5/3.6)
keep the text model under `model.language_model.*`: it is renamed to `model.*`, the vision tower
is skipped, and `mtp.*` is passed on for the MTP head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.checkpoint import Checkpoint, TensorRef

INDEX_FILE = "model.safetensors.index.json"
LANGUAGE_MODEL_PREFIX = "model.language_model."
SKIPPED_PREFIXES = ("model.visual.", "model.vision_tower.", "visual.", "vision_tower.", "model.multi_modal_projector.")
SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)  # old checkpoints saved the computed rope table


def read_config_json(path: Path, what: str = "a Hugging Face model directory") -> dict:
    """path/config.json as a dict, or a ModelLoadError that names the file."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path}: no config.json; {what} needs config.json and *.safetensors")
    try:
        return json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{config_path}: cannot read: {e}") from None


def open_hf_dir(path: Path) -> Checkpoint:
    source = str(path)
    config_path = path / "config.json"
    raw_config = read_config_json(path)
    config = ModelConfig.from_hf_dict(raw_config, source=str(config_path))
    tensors, skipped = _index_tensors(path)
    return Checkpoint(
        source=source,
        config=config,
        tensors=tensors,
        load_tokenizer=lambda: load_hf_tokenizer(path),
        chat_template=read_chat_template(path),
        skipped=skipped,
    )


def weight_files(path: Path) -> dict[str, list[str]]:
    """safetensors file name -> the tensor names the index assigns it (one file: all of them)."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"{index}: cannot read the weight_map: {e}") from None
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(file, []).append(name)
        for file in files:
            if not (path / file).is_file():
                raise ModelLoadError(f"{index}: lists {file}, which is not in {path}")
        return files
    single = sorted(path.glob("*.safetensors"))
    if single:
        return {f.name: [] for f in single}
    if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
        raise ModelLoadError(
            f"{path}: only PyTorch pickle weights (*.bin); treeflash reads safetensors only (pickles can run code). "
            "Convert them once, e.g. `AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`"
        )
    raise ModelLoadError(f"{path}: no *.safetensors weights")


def hf_to_ours(name: str) -> str | None:
    """A checkpoint tensor name -> our name, or None for a tensor we deliberately skip."""
    if name.startswith(LANGUAGE_MODEL_PREFIX):
        return "model." + name[len(LANGUAGE_MODEL_PREFIX) :]
    if name.startswith(SKIPPED_PREFIXES) or name.endswith(SKIPPED_SUFFIXES):
        return None
    return name


def _index_tensors(path: Path) -> tuple[dict[str, TensorRef], list[str]]:
    from safetensors import safe_open

    tensors: dict[str, TensorRef] = {}
    skipped: list[str] = []
    for file in weight_files(path):
        file_path = path / file
        try:
            with safe_open(file_path, framework="pt") as f:
                for name in f.keys():
                    ours = hf_to_ours(name)
                    if ours is None:
                        skipped.append(name)
                        continue
                    if ours in tensors:
                        raise ModelLoadError(f"{file_path}: tensor {name} appears twice (also in {tensors[ours].origin})")
                    shape = tuple(f.get_slice(name).get_shape())
                    tensors[ours] = TensorRef(shape=shape, read=_reader(file_path, name), origin=f"{name} in {file}")
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for a bad header
            raise ModelLoadError(f"{file_path}: not a readable safetensors file: {e}") from None
    return tensors, skipped


def _reader(file_path: Path, name: str):
    def read(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(file_path, framework="pt") as f:
            t = f.get_tensor(name)
        return t.to(device=device, dtype=dtype)

    return read


def load_hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot load the tokenizer (tokenizer.json / tokenizer_config.json): {e}") from None


def read_chat_template(path: Path) -> str | None:
    """chat_template.jinja, else tokenizer_config.json's `chat_template` (a string or a list of named ones)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg_path = path / "tokenizer_config.json"
    if not cfg_path.is_file():
        return None
    try:
        template = json.loads(cfg_path.read_text()).get("chat_template")
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{cfg_path}: cannot read: {e}") from None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
