"""Kernel-vs-reference checks for the fused decode kernels; run under TRITON_INTERPRET=1 in a
subprocess by tests/kernels/linear/test_fused_kernels.py (prints one JSON line of max errors)."""

from __future__ import annotations

import json
import sys

import torch


def beyond_two_ulps(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |got - ref| beyond two units in the last place of ref's dtype: fp32 math inside the
    kernel and in torch (exp, rsqrt) can round a bf16 intermediate and then the result either way.
    0 when every element is within two units."""
    ulp = 2 * (ref.float().abs() * torch.finfo(ref.dtype).eps + torch.finfo(ref.dtype).tiny)
    return ((got.float() - ref.float()).abs() - ulp).clamp(min=0).max().item()


def check_norms() -> dict:
    from treeflash.kernels.pointwise.norm import rmsnorm, rmsnorm_gated, rmsnorm_gated_ref, rmsnorm_ref

    out = {}
    for n, unit, res in ((64, False, False), (96, True, True), (40, False, True)):
        x, r, w = torch.randn(3, n), torch.randn(3, n), torch.randn(n)
        y, s = rmsnorm(x, w, 1e-6, unit, r if res else None)
        yr, sr = rmsnorm_ref(x, w, 1e-6, unit, r if res else None)
        out[f"rmsnorm_{n}_{unit}_{res}"] = max((y - yr).abs().max().item(), (s - sr).abs().max().item())
    x, g, w = torch.randn(5, 32), torch.randn(5, 32), torch.randn(32)
    out["rmsnorm_gated"] = (rmsnorm_gated(x, g, w, 1e-6) - rmsnorm_gated_ref(x, g, w, 1e-6)).abs().max().item()
    # an fp32 recurrence output normed into bf16 (rounded to bf16 first, as x.to(bf16) would)
    gb, wb = g.bfloat16(), w.bfloat16()
    got = rmsnorm_gated(x, gb, wb, 1e-6, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    out["rmsnorm_gated_fp32_in"] = beyond_two_ulps(got, rmsnorm_gated_ref(x.bfloat16(), gb, wb, 1e-6))
    # the Gated DeltaNet's z: [T, H, N] heads of a wider projection row, read in place
    x3, proj = torch.randn(3, 4, 16), torch.randn(3, 100)
    z = proj[:, 20:84].view(3, 4, 16)
    assert not z.is_contiguous()
    w16 = torch.randn(16)
    out["rmsnorm_gated_strided_gate"] = (rmsnorm_gated(x3, z, w16, 1e-6) - rmsnorm_gated_ref(x3, z.contiguous(), w16, 1e-6)).abs().max().item()
    x, w = torch.randn(2, 5000), torch.randn(5000)  # a wide row (16 warps on a GPU)
    out["rmsnorm_wide"] = (rmsnorm(x, w, 1e-6)[0] - rmsnorm_ref(x, w, 1e-6)[0]).abs().max().item()
    # out=: the normed rows land in rows of a larger buffer (a static draft pass's [n + B, H]), the rest untouched
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    buf = torch.full((7, 64), 3.0)
    y, s = rmsnorm(x, w, 1e-6, False, r, out=buf[3:])
    yr, sr = rmsnorm_ref(x, w, 1e-6, False, r)
    assert y.data_ptr() == buf[3:].data_ptr() and bool((buf[:3] == 3.0).all())
    out["rmsnorm_out_rows"] = max((buf[3:] - yr).abs().max().item(), (s - sr).abs().max().item())
    return out


def check_rotary() -> dict:
    from treeflash.kernels.pointwise.rotary import norm_rotary, norm_rotary_ref

    out = {}
    for d, rd, norm, unit in ((64, 64, False, False), (64, 16, True, True), (32, 32, True, False)):
        base = torch.randn(3, 4, 2 * d)
        x = base[..., :d]  # a strided view, like the gated q of qwen3_5
        cos, sin = torch.randn(3, rd), torch.randn(3, rd)
        w = torch.randn(d) if norm else None
        out[f"rotary_{d}_{rd}_{norm}"] = (norm_rotary(x, cos, sin, w, 1e-6, unit) - norm_rotary_ref(x, cos, sin, w, 1e-6, unit)).abs().max().item()
    out.update(check_rotary_into_cache())
    return out


def check_rotary_into_cache() -> dict:
    """norm_rotary_into_cache: the turned queries, and the cache rows it writes (keys turned,
    values as they are) against the reference, for strided q/k/v views of one qkv row; the other
    cache rows stay untouched."""
    from treeflash.kernels.pointwise.rotary import norm_rotary_into_cache, norm_rotary_into_cache_ref

    out = {}
    for d, rd, hq, hkv, norm, unit, folded in ((64, 64, 4, 2, True, False, False), (64, 16, 6, 2, True, True, False),
                                               (32, 32, 2, 2, False, False, False), (64, 64, 4, 2, False, False, True),
                                               (64, 32, 4, 2, True, False, True)):
        t, slots_n = 3, 10
        qkv = torch.randn(t, (2 * hq + 2 * hkv) * d)  # a gated q: [q | gate] per head, then k, then v
        q = qkv[:, : 2 * hq * d].view(t, hq, 2 * d)[..., :d]
        k = qkv[:, 2 * hq * d : (2 * hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (2 * hq + hkv) * d :].view(t, hkv, d)
        cos, sin = torch.randn(t, rd), torch.randn(t, rd)
        qw, kw = (torch.randn(d), torch.randn(d)) if norm else (None, None)
        slots = torch.tensor([7, 2, 5])
        before = (torch.randn(slots_n, hkv, d), torch.randn(slots_n, hkv, d))
        caches = [(before[0].clone(), before[1].clone()) for _ in range(2)]
        ref_k, ref_v = caches[1]
        # folded: the input norm's 1 / rms of a 200-wide stream (a width that is not a power of two)
        rows = (torch.randn(t, 200) * 3, 1e-5) if folded else None
        got_q = norm_rotary_into_cache(q, k, v, cos, sin, qw, kw, 1e-6, unit, *caches[0], slots, rows)
        ref_q = norm_rotary_into_cache_ref(q, k, v, cos, sin, qw, kw, 1e-6, unit, ref_k, ref_v, slots, rows)
        err = max((got_q - ref_q).abs().max().item(), (caches[0][0] - ref_k).abs().max().item(),
                  (caches[0][1] - ref_v).abs().max().item())
        out[f"rotary_into_cache_{d}_{rd}_{hq}_{norm}" + ("_folded" if folded else "")] = err
    return out


def check_activation() -> dict:
    from treeflash.kernels.pointwise.activation import silu_mul, silu_mul_ref

    from treeflash.kernels.pointwise.activation import sigmoid_gate, sigmoid_gate_ref

    x = torch.randn(3, 2 * 1500)
    out = {"silu_mul": (silu_mul(x) - silu_mul_ref(x)).abs().max().item()}
    rows = (torch.randn(3, 576) * 4, 1e-5)  # the folded MLP norm's 1 / rms
    out["silu_mul_folded"] = (silu_mul(x, rows) - silu_mul_ref(x, rows)).abs().max().item()
    for dtype in (torch.float32, torch.bfloat16):  # the gate: the second half of each head's [q | gate]
        qg = torch.randn(2, 6, 2 * 256).to(dtype)
        gate, y = qg[..., 256:], torch.randn(2, 6 * 256).to(dtype)
        out[f"sigmoid_gate_{dtype}"] = beyond_two_ulps(sigmoid_gate(y, gate), sigmoid_gate_ref(y, gate))
    return out


def check_gdn() -> dict:
    from treeflash.kernels.gdn.gdn_decode import conv_step, conv_step_ref, recurrent_step, recurrent_step_ref

    hk, hv, dk, dv = 2, 4, 16, 32
    c = 2 * hk * dk + hv * dv
    x, win, w = torch.randn(c), torch.randn(c, 3), torch.randn(c, 4)
    win2 = win.clone()
    y = conv_step(x, win, w)
    yr = conv_step_ref(x, win2, w)
    out = {"conv_step": max((y - yr).abs().max().item(), (win - win2).abs().max().item())}
    a, b, alog, dtb = torch.randn(hv), torch.randn(hv), torch.randn(hv), torch.randn(hv)
    s1 = torch.randn(hv, dk, dv)
    s2 = s1.clone()
    o = recurrent_step(yr, a, b, alog, dtb, s1, hk, dk, dv)
    orf = recurrent_step_ref(yr, a, b, alog, dtb, s2, hk, dk, dv)
    out["recurrent_step"] = max((o - orf).abs().max().item(), (s1 - s2).abs().max().item())
    return out


def tree_mask_of(parents: list[int], pad_to: int) -> torch.Tensor:
    """[T, T] ancestor-or-self mask, as a view into a [pad_to, pad_to] buffer (strided rows, like the runner's)."""
    buf = torch.zeros(pad_to, pad_to, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            buf[i] = buf[p]
        buf[i, i] = True
    return buf[: len(parents), : len(parents)]


def check_gdn_tree() -> dict:
    from treeflash.kernels.gdn.gdn_decode import recurrent_step
    from treeflash.kernels.gdn.gdn_tree import (recurrent_path, recurrent_path_ref, tree_conv, tree_conv_ref, tree_recurrent,
                                            tree_recurrent_ref)

    hk, hv, dk, dv = 2, 4, 16, 32
    c = 2 * hk * dk + hv * dv
    out = {}
    trees = (("chain", [-1, 0, 1, 2, 3], [0, 1, 2]), ("tree", [-1, 0, 0, 1, 2, 2, 5, 3, 0], [0, 2, 5, 6]),
             ("root", [-1], [0]), ("padded", [-1, 0, 1, 0, 0, 0], [0, 1, 2]),  # padding nodes: children of the root
             ("padded_many", [-1, 0, 1, 2] + [0] * 20, [0, 1, 2, 3]),  # more leaf children than one block (16)
             ("two_roots", [-1, -1, 0, 1, 1, 2], [1, 3]),  # leaf children of the committed prefix
             ("deep40", list(range(-1, 29)) + [3, 3, 30, 10, 33, 0, -1, 36, 37, 28], list(range(0, 29))))  # 64-row chunk tiles
    # the walks' launch variants (the default: out_split)
    variants = {"walk": dict(out_split=False), "walk_bv8": dict(block_v=8, out_split=False), "walk_w2": dict(num_warps=2, out_split=False),
                "walk_ksplit2": dict(kids_split=2), "walk_ksplit3": dict(kids_split=3),
                "walk_outsplit": dict(out_split=True), "walk_outsplit_bv8": dict(out_split=True, block_v=8)}
    for name, parents, path in trees:
        t = len(parents)
        par = torch.tensor(parents)
        # x, a, b: strided views of one projection row per node, as the model passes them
        proj = torch.randn(t, c + 5 + 2 * hv)
        x, a, b = proj[:, :c], proj[:, c + 5 : c + 5 + hv], proj[:, c + 5 + hv :]
        win, w = torch.randn(c, 3), torch.randn(c, 4)
        y = tree_conv(x, win, w, par)
        yr = tree_conv_ref(x, win, w, par)
        alog, dtb, s0 = torch.randn(hv), torch.randn(hv), torch.randn(hv, dk, dv)
        o = tree_recurrent(yr, a, b, alog, dtb, s0, par, tree_mask_of(parents, 8 if t < 8 else t), hk, dk, dv)
        orf = tree_recurrent_ref(yr, a, b, alog, dtb, s0, par, hk, dk, dv)
        out[f"conv_{name}"] = (y - yr).abs().max().item()
        out[f"recurrent_{name}"] = (o - orf).abs().max().item()
        if name in ("tree", "padded_many", "deep40"):
            for vname, kw in variants.items():
                ov = tree_recurrent(yr, a, b, alog, dtb, s0, par, tree_mask_of(parents, t), hk, dk, dv, **kw)
                out[f"recurrent_{name}_{vname}"] = (ov - orf).abs().max().item()
            # a group of 3 v heads per k head (the 27B shape's ratio: not a power of 2)
            hv3, c3 = 6, 2 * hk * dk + 6 * dv
            y3, a3, b3 = torch.randn(t, c3), torch.randn(t, hv3), torch.randn(t, hv3)
            al3, dt3, s3_0 = torch.randn(hv3), torch.randn(hv3), torch.randn(hv3, dk, dv)
            o3 = tree_recurrent(y3, a3, b3, al3, dt3, s3_0, par, tree_mask_of(parents, t), hk, dk, dv)
            out[f"recurrent_{name}_group3"] = (o3 - tree_recurrent_ref(y3, a3, b3, al3, dt3, s3_0, par, hk, dk, dv)).abs().max().item()

        if name == "deep40":  # k heads of 64
            dk2, c2 = 64, 2 * hk * 64 + hv * dv
            y2, a2, b2 = torch.randn(t, c2), torch.randn(t, hv), torch.randn(t, hv)
            y2[:, : 2 * hk * dk2] /= dk2**0.5  # unit-ish q, k as the model's normalization gives
            al2, dt2, s2_0 = torch.randn(hv), torch.randn(hv), torch.randn(hv, dk2, dv)
            ref2 = tree_recurrent_ref(y2, a2, b2, al2, dt2, s2_0, par, hk, dk2, dv)
            for vname, kw in (("walk", dict(out_split=False)), ("walk_outsplit", dict(out_split=True))):
                o2 = tree_recurrent(y2, a2, b2, al2, dt2, s2_0, par, tree_mask_of(parents, t), hk, dk2, dv, **kw)
                out[f"recurrent_{name}_dk64_{vname}"] = ((o2 - ref2).abs().max() / ref2.abs().max()).item()

        # commit: the path kernel (path padded past its length, as in the commit graph) against its
        # reference, and bit for bit against plain decode steps over the same rows
        padded = torch.tensor(path + [path[-1]] * (t - len(path)))
        s1, s2, s3 = s0.clone(), s0.clone(), s0.clone()
        recurrent_path(yr, a, b, alog, dtb, s1, padded, torch.tensor([len(path)]), hk, dk, dv)
        recurrent_path_ref(yr, a, b, alog, dtb, s2, padded, torch.tensor([len(path)]), hk, dk, dv)
        for i in path:
            recurrent_step(yr[i], a[i], b[i], alog, dtb, s3, hk, dk, dv)
        out[f"path_{name}"] = (s1 - s2).abs().max().item()
        out[f"path_{name}_vs_decode_steps_bitwise"] = 0.0 if torch.equal(s1, s3) else 1.0
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps(globals()[f"check_{sys.argv[1]}"]()))
