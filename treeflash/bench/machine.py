"""What a measurement ran on: versions, CPU, memory, GPU, and the memory bandwidth that bounds decode.

Decode at batch 1 is memory-bound: plain decoding cannot beat bandwidth / weight bytes tokens/s.
`roofline` measures the bandwidth with a large on-device copy and states that bound, so every
decode figure can be read as a fraction of what the hardware allows.
"""

from __future__ import annotations

import os
import platform
import time
from importlib import metadata


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("treeflash", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    if out["treeflash"] is None:
        from treeflash import __version__

        out["treeflash"] = __version__
    return out


def machine() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "torch_threads": torch.get_num_threads(),
        "load_average": _load_average(),  # other tenants' work: wall-clock figures are only as good as this is low
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _ram_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def bandwidth_gbs(device, mib: int = 128, repeats: int = 5) -> float:
    """Best-of-`repeats` copy bandwidth (read + write bytes per second) of a `mib` MiB buffer on `device`."""
    import torch

    n = mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        if src.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if src.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best / 1e9


def roofline(model) -> dict:
    """The plain-decoding bound for `model` (a CausalLM) on its device: weights read once per token, KV ignored."""
    import torch

    # unique storages of parameters and buffers: fused projections make parameters views of one buffer
    storages = {}
    for t in [*model.parameters(), *model.buffers()]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None and (not getattr(model.config, "tie_word_embeddings", True) or getattr(model, "head_weight_bf16", None) is not None):
        table = embed.weight if isinstance(embed, torch.nn.Embedding) else embed.blocks  # (a QuantEmbedding: GGUF blocks)
        storages.pop(table.untyped_storage().data_ptr(), None)  # one row read per token, not the table
    weight_bytes = sum(storages.values())
    device = next(model.parameters()).device
    bw = bandwidth_gbs(device)
    return {
        "device": str(device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "weights": getattr(model, "weights_format", "float"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weight_bytes,
        "bandwidth_gbs": round(bw, 2),
        "ar_bound_tokens_per_second": round(bw * 1e9 / max(weight_bytes, 1), 2),
        "threads": torch.get_num_threads(),
    }
