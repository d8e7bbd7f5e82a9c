"""drafter_shape: a drafter's memory described by shapes, from its checkpoint header (no weight read).

The spec layer builds it because the drafters' own configs live here (DFlashConfig); the planner
(models/memory/plan.py) takes the resulting DrafterShape without knowing drafter types.
"""

from __future__ import annotations

from pathlib import Path

from treeflash.errors import InvalidRequestError, ModelLoadError
from treeflash.models.memory import parts
from treeflash.models.memory.header import CheckpointHeader, read_header, read_safetensors_dir
from treeflash.models.memory.placement import device_bytes
from treeflash.models.memory.plan import DrafterShape

DRAFTERS = ("ngram", "draft", "mtp", "dflash")


def drafter_shape(kind: str | None, draft_model: str | None, target: CheckpointHeader, dtype_bytes: int,
                  device_type: str = "cuda", drafter_weights: str = "float") -> DrafterShape | None:
    """The DrafterShape of `--draft kind --draft-model path` for this target (None without a drafter).
    drafter_weights: dflash's linear layers at the runtime dtype ("float") or as Q8_0 blocks ("q8_0")."""
    if kind is None:
        return None
    if kind not in DRAFTERS:
        raise InvalidRequestError(f"unknown drafter {kind!r}; choose one of: {', '.join(DRAFTERS)}", "draft")
    if kind == "ngram":
        return DrafterShape("ngram")
    if kind == "mtp":
        c = target.config
        if c.mtp_num_layers == 0 or not any(t.name.startswith("mtp.") for t in target.tensors):
            raise InvalidRequestError(f"--draft mtp: {target.source} has no MTP head (mtp.* weights)", "draft")
        return DrafterShape("mtp", num_layers=c.mtp_num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                            source=target.source)  # its weights are the target's mtp.* tensors, counted there
    path = draft_model or (_default_dflash(target) if kind == "dflash" else None)
    if not path:
        raise InvalidRequestError(f"--draft {kind} needs --draft-model", "draft_model")
    if kind == "draft":
        h = read_header(path)
        c = h.config
        weights = sum(device_bytes(t.name, t.shape, t.stored_type, t.stored_bytes, "float", device_type, dtype_bytes) for t in h.tensors)
        return DrafterShape("draft", weights, len(c.attention_layer_ids), c.num_kv_heads, c.head_dim, c.rotary_dim,
                            parts.recurrent_state_bytes(c, dtype_bytes) if c.is_hybrid else 0, source=str(path))
    return _dflash_shape(Path(path).expanduser(), target, dtype_bytes, drafter_weights)


def _default_dflash(target: CheckpointHeader) -> str | None:
    from treeflash.models.default_model import default_drafter_path, is_default_model

    p = default_drafter_path() if is_default_model(target.source) else None
    return str(p) if p is not None else None


Q8_0_BYTES_PER_VALUE = 34 / 32  # an fp16 scale and 32 int8 codes


def _dflash_shape(path: Path, target: CheckpointHeader, dtype_bytes: int, drafter_weights: str = "float") -> DrafterShape:
    import torch

    from treeflash.models.hf_loader import read_config_json
    from treeflash.spec.dflash_model import DRAFTER_WEIGHTS, DFlashConfig, DFlashModel, quantized_linear_names

    if not path.is_dir():
        raise ModelLoadError(f"{path}: a DFlash drafter is a directory (config.json + *.safetensors)")
    c = DFlashConfig.from_dict(read_config_json(path, "a DFlash checkpoint"), source=str(path / "config.json"))
    if drafter_weights not in DRAFTER_WEIGHTS:
        raise InvalidRequestError(f"--drafter-weights must be one of {', '.join(DRAFTER_WEIGHTS)}, got {drafter_weights!r}", "drafter_weights")
    tensors, _ = read_safetensors_dir(path)
    quantized: set[str] = set()
    if drafter_weights == "q8_0":
        with torch.device("meta"):
            quantized = quantized_linear_names(DFlashModel(c))  # as load_dflash quantizes them
    weights = 0  # load_dflash: the target's dtype, or Q8_0 blocks
    for name, (_, shape, _) in tensors.items():
        blocks = name.removeprefix("model.") in quantized
        weights += int(_numel(shape) * Q8_0_BYTES_PER_VALUE) if blocks else _numel(shape) * dtype_bytes
    rotary = int(c.head_dim * c.rope.partial_rotary_factor)
    return DrafterShape("dflash", weights, c.num_layers, c.num_kv_heads, c.head_dim, rotary,
                        capture_width=len(c.target_layer_ids) * c.hidden_size, block_size=c.block_size,
                        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_heads=c.num_heads,
                        source=str(path) + (" (q8_0 blocks)" if quantized else ""))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
