"""Checkpoint headers: every tensor's name, shape, stored type and stored bytes, no weight read.

A GGUF file's tensor table comes from gguf's GGUFReader (it maps the file and parses only the
header); a safetensors file starts with an 8-byte little-endian length and that many bytes of JSON
({name: {dtype, shape, data_offsets}}), read here directly. Names are ours (the loaders' mapping),
and the list holds exactly the tensors models/loader.py would load: skipped tensors (a vision tower,
a GGUF's MTP block, the duplicate of a tied head) are listed apart.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig

MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class HeaderTensor:
    name: str  # our name (model.*, lm_head.*, mtp.*)
    shape: tuple[int, ...]  # as the model holds it
    stored_type: str  # GGUF: the ggml type name ("Q4_K", "F32"); safetensors: its dtype ("BF16")
    stored_bytes: int  # bytes in the file

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class CheckpointHeader:
    source: str
    format: str  # "gguf" | "safetensors"
    config: ModelConfig
    tensors: tuple[HeaderTensor, ...]  # the tensors the loader fills
    skipped: tuple[str, ...]  # file names of tensors the loader leaves out
    data_bytes: int  # the file's (files') tensor data region(s), for checking the sum of stored_bytes

    def stored_bytes(self) -> int:
        return sum(t.stored_bytes for t in self.tensors)


def read_header(path: str | Path) -> CheckpointHeader:
    """A Hugging Face directory (config.json + *.safetensors) or a .gguf file -> its header. A path that
    does not exist but reads as a Hub id is fetched first, as the loader does (models/hub.py)."""
    from treeflash.models.hub import resolve_model_path

    p = resolve_model_path(path)
    if p.is_dir():
        return read_hf_header(p)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return read_gguf_header(p)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory; pass a Hugging Face model directory or a .gguf file")
    raise ModelLoadError(f"{p}: not a model; pass a Hugging Face model directory (config.json + *.safetensors) or a .gguf file")


def read_gguf_header(path: Path) -> CheckpointHeader:
    from gguf import GGMLQuantizationType

    from treeflash.models.gguf_loader import ARCH_MODEL_TYPE, TOKENIZER_ARRAYS, gguf_to_ours, hf_config_dict, read_gguf
    from treeflash.models.gguf_nextn import mtp_name

    reader = read_gguf(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k not in TOKENIZER_ARRAYS}
    arch = meta.get("general.architecture")
    if arch not in ARCH_MODEL_TYPE:
        raise ModelLoadError(f"{path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCH_MODEL_TYPE)}")
    by_name = {t.name: t for t in reader.tensors}
    config = ModelConfig.from_hf_dict(hf_config_dict(meta, reader, by_name), source=str(path))
    tensors, skipped = [], []
    for name, t in by_name.items():
        ours = None if name == "rope_freqs.weight" else gguf_to_ours(name)  # rope_freqs divides a computed buffer
        if arch == "qwen35" and ours is not None and ours.startswith("model.layers."):
            ours = mtp_name(ours, name, config.num_layers, config.mtp_num_layers, str(path))  # the MTP (nextn) blocks
        if ours is None:
            skipped.append(name)
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if ours.endswith("linear_attn.conv1d.weight") and len(shape) == 2:
            shape = (shape[0], 1, shape[1])  # the loader's fix-up: [C, K] -> nn.Conv1d's [C, 1, K]
        tensors.append(HeaderTensor(ours, shape, GGMLQuantizationType(int(t.tensor_type)).name, int(t.n_bytes)))
    data_bytes = path.stat().st_size - int(reader.data_offset)
    return CheckpointHeader(str(path), "gguf", config, tuple(tensors), tuple(skipped), data_bytes)


def read_safetensors_file(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int]], int]:
    """One .safetensors file -> ({name: (dtype, shape, bytes)}, bytes of its data region)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_SAFETENSORS_HEADER:
                raise ValueError(f"header length {n} is over the format's limit")
            header = json.loads(f.read(n))
        size = path.stat().st_size - 8 - n
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            if not 0 <= begin <= end <= size:
                raise ValueError(f"tensor {name} lies outside the data region ({begin}..{end} of {size} bytes)")
            out[name] = (str(entry["dtype"]), tuple(int(d) for d in entry["shape"]), int(end - begin))
        return out, size
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path}: not a readable safetensors file: {e}") from None


def read_safetensors_dir(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int]], int]:
    """Every tensor of a directory's safetensors files (the index's, or all *.safetensors) -> (tensors, data bytes)."""
    from treeflash.models.hf_loader import weight_files

    tensors: dict[str, tuple[str, tuple[int, ...], int]] = {}
    data = 0
    for file in weight_files(path):
        found, size = read_safetensors_file(path / file)
        tensors.update(found)
        data += size
    return tensors, data


def read_hf_header(path: Path) -> CheckpointHeader:
    from treeflash.models.hf_loader import hf_to_ours, read_config_json

    config = ModelConfig.from_hf_dict(read_config_json(path), source=str(path / "config.json"))
    raw, data_bytes = read_safetensors_dir(path)
    tensors, skipped = [], []
    for name, (dtype, shape, nbytes) in raw.items():
        ours = hf_to_ours(name)
        tied_head = config.tie_word_embeddings and ours == "lm_head.weight"
        no_mtp = ours is not None and ours.startswith("mtp.") and config.mtp_num_layers == 0
        if ours is None or tied_head or no_mtp:
            skipped.append(name)
            continue
        tensors.append(HeaderTensor(ours, shape, dtype, nbytes))
    return CheckpointHeader(str(path), "safetensors", config, tuple(tensors), tuple(skipped), data_bytes)
