"""Dequantization of GGUF tensor data: gguf-py's own dequantizer, the reference for every ggml type.

A GGUF file keeps each tensor's own type (Unsloth Dynamic mixes put attention at Q6_K/Q8_0 and the
FFN at Q3_K or an i-quant). Every block type that `gguf.quants.dequantize` decodes is read through it
(on the CPU, in row chunks, then moved to the raw bytes' device), so there is no second copy of the
block layouts here to drift from llama.cpp's. The float types (F32, F16, BF16) are viewed in place on
any device. A type gguf cannot decode (Q8_K, Q8_1, integer tensors, ...) raises ValueError naming it;
the loader turns that into a ModelLoadError naming the tensor, never a silent wrong result.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

MAX_CHUNK_ELEMS = 1 << 24  # values dequantized at once (bounds the fp32 temporaries of a huge tensor)
FLOAT_TYPES: dict[int, torch.dtype] = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}


def type_name(ggml_type: int) -> str:
    try:
        return T(ggml_type).name
    except ValueError:
        return f"ggml type {ggml_type}"


def can_dequantize(ggml_type: int) -> bool:
    """Whether `dequantize` reads this type: a float type, or a block type gguf-py decodes."""
    if ggml_type in FLOAT_TYPES:
        return True
    try:
        traits = quants._type_traits.get(T(ggml_type))
    except ValueError:
        return False
    return traits is not None and hasattr(traits, "dequantize_blocks")


def readable_types() -> list[str]:
    return [t.name for t in T if can_dequantize(t)]


def block_layout(ggml_type: int) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type (1 value per "block" for the float types)."""
    try:
        return GGML_QUANT_SIZES[T(ggml_type)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown tensor type {type_name(ggml_type)}") from None


def nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes that a tensor of `shape` (torch order) takes when stored as `ggml_type`."""
    elems, size = block_layout(ggml_type)
    if shape and shape[-1] % elems:
        raise ValueError(f"row length {shape[-1]} is not a multiple of the {type_name(ggml_type)} block size {elems}")
    return math.prod(shape) // elems * size


def dequantize(
    raw: torch.Tensor,  # [nbytes] uint8, on any device
    ggml_type: int,
    shape: tuple[int, ...],  # torch order (outermost first)
    dtype: torch.dtype = torch.float32,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,  # values dequantized at once
) -> torch.Tensor:  # shape, dtype, on raw's device
    if not can_dequantize(ggml_type):
        raise ValueError(f"unsupported tensor type {type_name(ggml_type)} (no dequantizer in gguf-py); readable: {', '.join(readable_types())}")
    want = nbytes(ggml_type, shape)
    if raw.dtype != torch.uint8 or raw.numel() != want:
        raise ValueError(f"{type_name(ggml_type)} {tuple(shape)} needs {want} bytes, got {raw.numel()}")
    raw = raw.reshape(-1)
    if ggml_type in FLOAT_TYPES:
        return raw.view(FLOAT_TYPES[ggml_type]).reshape(shape).to(dtype)
    elems, size = block_layout(ggml_type)
    blocks = raw.view(-1, size)  # [n_blocks, block_bytes]
    step = max(1, max_chunk_elems // elems)
    qtype = T(ggml_type)
    out = torch.empty(blocks.shape[0], elems, dtype=dtype, device=raw.device)
    for i in range(0, blocks.shape[0], step):
        chunk = blocks[i : i + step].cpu().numpy()
        values = quants.dequantize(chunk, qtype)  # [n, elems] fp32 (gguf decodes along the last axis)
        out[i : i + step] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(raw.device)
    return out.reshape(shape)


def dequantize_rows(
    blocks: torch.Tensor,  # [N, K / block_values * block_bytes] uint8: rows as stored
    ggml_type: int,
    k: int,
    dtype: torch.dtype = torch.float32,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,
) -> torch.Tensor:  # [N, K] dtype, on blocks' device
    return dequantize(blocks.reshape(-1), ggml_type, (blocks.shape[0], k), dtype, max_chunk_elems)
