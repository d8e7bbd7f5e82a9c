"""Weight placement: the bytes one checkpoint tensor takes on the device once loaded.

One table decides it, so a weight format that learns to stay packed is one entry here:

- `--weights native` on CUDA: a GGUF linear weight of a type in NATIVE_BLOCK_TYPES stays in its
  stored blocks (bytes = gguf's GGML_QUANT_SIZES block bytes x blocks, i.e. what the file holds), and so
  does the token embedding (models/quant_embedding.py); the MTP head's matrices are read float.
- `--weights int4` on the CPU: Q4_0 / Q4_1 linear weights become models/int4_linear.py's packed
  4-bit codes plus a bf16 scale and zero per 32 values (0.625 bytes a value), twice for q/k/v and
  gate/up (use_int4_model keeps each layer and adds one fused copy); the head's bf16 copy is `plan`'s.
- everything else (other types, norms, a float embedding, every tensor of a bf16 checkpoint) is
  dequantized to the runtime dtype, as models/loader.py reads every tensor (`ref.read(device, dtype)`).
"""

from __future__ import annotations

import math

NATIVE_BLOCK_TYPES = frozenset({"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"})
INT4_CPU_TYPES = frozenset({"Q4_0", "Q4_1"})
INT4_BYTES_PER_VALUE = 0.5 + 2 * 2 / 32  # packed nibbles + bf16 scale and zero per group of 32
INT4_FUSED_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
WEIGHT_MODES = ("float", "int4", "native")
# the loader's linear layers (nn.Linear weights); embeddings, norms and DeltaNet vectors are not
LINEAR_SUFFIXES = ("_proj.weight", "in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight", "in_proj_b.weight")


EMBEDDING = "model.embed_tokens.weight"
MTP_PREFIX = "mtp."  # models/loader.py: the MTP head's tensors


def is_linear(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and (name.endswith(LINEAR_SUFFIXES) or name == "lm_head.weight")


def device_bytes(name: str, shape: tuple[int, ...], stored_type: str, stored_bytes: int, weights: str, device_type: str,
                 dtype_bytes: int) -> int:
    """Bytes of one tensor on the device. stored_type: the file's type name (GGUF: "Q4_K", "F32", ...;
    safetensors: "BF16", "F32", ...); dtype_bytes: the runtime dtype's element size."""
    numel = math.prod(shape)
    linear = is_linear(name, shape)
    if name.startswith(MTP_PREFIX):  # the loader keeps the MTP head's matrices float (MTPHead reads their dtype)
        linear = False
    # on CUDA the token embedding stays in its blocks too (models/quant_embedding.py; a tied head shares them)
    kept = linear or name == EMBEDDING
    if weights == "native" and device_type == "cuda" and kept and stored_type in NATIVE_BLOCK_TYPES:
        return stored_bytes
    if weights == "int4" and device_type == "cpu" and linear and stored_type in INT4_CPU_TYPES:
        copies = 2 if name.endswith(INT4_FUSED_SUFFIXES) else 1
        return copies * math.ceil(numel * INT4_BYTES_PER_VALUE)
    return numel * dtype_bytes
