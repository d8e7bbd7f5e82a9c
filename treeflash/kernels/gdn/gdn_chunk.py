"""Gated DeltaNet prefill on CUDA through flash-linear-attention's chunked kernels (the `fla` package).

The plain-torch reference is `models.gated_deltanet.delta_rule_chunked`: the same WY / UT chunk
form, but with a Python loop over 64-token chunks (per layer, 512 iterations of ~4 launches at 32K
tokens, i.e. host-bound on a slow host). flash-linear-attention's `chunk_gated_delta_rule` runs the
whole prompt in a handful of Triton launches per layer, with the l2 norms of q and k in the kernel.

It is optional: with `fla` not installed, not on CUDA, or once it failed in a layer (that layer's
`use_fla` turns off), prefill uses the reference. Do not install it on a CPU-only machine: transformers then routes its own Gated DeltaNet
to it and fails there. What is checked where: bench/gpu_fla.py (H200) against the reference, at the
27B head shapes, for outputs and the final state; the CPU suite checks the dispatch only.

Conventions, the same on both sides: state [Hv, Dk, Dv] fp32 (k-major, as fla's default layout);
v head h reads k head h // (Hv / Hk) (fla's grouped-value attention, our repeat_interleave);
l2norm x * rsqrt(sum x^2 + 1e-6); q scaled by Dk^-0.5 after its norm.
"""

from __future__ import annotations

from functools import cache

import torch

@cache
def _fla_chunk():
    """fla's chunk_gated_delta_rule, or None when the package is missing or does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # not installed, or built against another triton: the reference serves
        return None
    return chunk_gated_delta_rule


def available(x: torch.Tensor) -> bool:
    """Whether prefill of tensors like x can go through fla (CUDA, the package imports)."""
    return x.is_cuda and _fla_chunk() is not None


def warn_failed(error: BaseException) -> None:
    """fla failed (e.g. its kernels do not compile against this triton): say so; the caller uses the
    reference from now on, rather than failing every prefill."""
    import warnings

    warnings.warn(f"flash-linear-attention failed ({type(error).__name__}: {error}); Gated DeltaNet prefill "
                  "falls back to the torch reference", RuntimeWarning, stacklevel=3)


def chunk_gated_delta(
    q: torch.Tensor,  # [T, Hk, Dk] raw conv outputs (normalized inside), any float dtype
    k: torch.Tensor,  # [T, Hk, Dk] raw conv outputs
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] fp32 log decay (<= 0)
    beta: torch.Tensor,  # [T, Hv] fp32 write strength in (0, 1)
    state: torch.Tensor,  # [Hv, Dk, Dv] fp32 initial state (not modified)
    dtype: torch.dtype,  # the dtype q, k, v go in with (the model's: bf16 on the GPU)
) -> tuple[torch.Tensor, torch.Tensor]:  # o: [T, Hv, Dv] fp32, final state: [Hv, Dk, Dv] fp32
    fn = _fla_chunk()
    if fn is None:
        raise RuntimeError("flash-linear-attention is not importable; check gdn_chunk.available() first")
    o, final = fn(
        q.to(dtype)[None], k.to(dtype)[None], v.to(dtype)[None], g.float()[None], beta.float()[None],
        scale=q.shape[-1] ** -0.5, initial_state=state.float()[None].contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return o[0].float(), final[0].float()
