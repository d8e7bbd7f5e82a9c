"""llama.cpp's MTP ("nextn") blocks in a qwen35 GGUF, named as the Hugging Face checkpoint names them.

llama.cpp's converter (conversion/qwen.py, _Qwen35MtpMixin) appends `mtp_num_hidden_layers` blocks
after the trunk (block_count counts them; `{arch}.nextn_predict_layers` says how many) and writes:
- mtp.layers.{i}.<decoder layer>     -> blk.{L+i}.<the usual block names> (attn_q, ffn_up, ...)
- mtp.fc                             -> blk.{b}.nextn.eh_proj, for every MTP block b
- mtp.pre_fc_norm_embedding / _hidden-> blk.{b}.nextn.enorm / nextn.hnorm
- mtp.norm                           -> blk.{b}.nextn.shared_head_norm
(gguf-py's TENSOR_NAMES: NEXTN_EH_PROJ, NEXTN_ENORM, NEXTN_HNORM, NEXTN_SHARED_HEAD_NORM.) The norms
are stored as w + 1 like every zero-centred norm of the arch (gguf_loader's fixups undo it).
"""

from __future__ import annotations

from treeflash.errors import ModelLoadError

NEXTN_NAMES = {  # blk.N.nextn.<gguf> -> mtp.<ours> (gguf_to_ours yields model.layers.N.nextn.*; mtp_name renames)
    "nextn.eh_proj": "fc",
    "nextn.enorm": "pre_fc_norm_embedding",
    "nextn.hnorm": "pre_fc_norm_hidden",
    "nextn.shared_head_norm": "norm",
}
NEXTN_REFUSED = ("nextn.embed_tokens", "nextn.shared_head_head")


def mtp_name(ours: str, gguf_name: str, num_layers: int, mtp_layers: int, source: str) -> str | None:
    """model.layers.N.* -> itself for a target layer, mtp.* for an MTP block (None: a repeated head
    tensor of a later block). Raises for a tensor past the MTP blocks or one Qwen3.5 never has."""
    _, _, i, rest = ours.split(".", 3)
    layer = int(i)
    if rest.startswith("nextn.") and layer < num_layers:
        raise ModelLoadError(f"{source}: {gguf_name}: nextn tensors belong to the MTP blocks (from blk.{num_layers})")
    if layer < num_layers:
        return ours
    if layer >= num_layers + mtp_layers:
        raise ModelLoadError(f"{source}: unexpected tensor {gguf_name}: the file has {num_layers} layers and {mtp_layers} MTP blocks")
    leaf = rest.rpartition(".")[0]
    if leaf in NEXTN_REFUSED:
        raise ModelLoadError(f"{source}: {gguf_name}: an MTP head with its own embedding / lm_head is not supported (Qwen3.5/3.6 share the target's)")
    if leaf in NEXTN_NAMES:
        return f"mtp.{NEXTN_NAMES[leaf]}.weight" if layer == num_layers else None
    return f"mtp.layers.{layer - num_layers}.{rest}"
