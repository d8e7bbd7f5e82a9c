"""Bench-only variants of the KV cache types for bench/kv_quality.py: they patch the formats module
or the compressed cache while one pair runs (CPU reference path only); none is a cache type of the
runtime.

"tq3_0-norot" is tq3_0's reference quantizer (formats.quantize_tq3_0 / dequantize_tq3_0: per
group L2 normalization, Lloyd-Max centroids, per-block scale) with `formats.rotate` and
`formats.unrotate` patched to the identity while that pair runs (CPU reference path only). It
measures what the rotation buys; it is not a cache type of the runtime.

"<type>-sinkN" (e.g. tq3_0-sink4, q4_0-sink16; bench-only, CPU reference path only) is <type> with
the rows of positions < N kept exact: every write still quantizes all rows as the cache does, and
the rows of positions < N are also kept as written (fp32: for K that is the centered key k - m,
which attention treats exactly like k since m is fixed per head), then put back in place of
their dequantized rows on every read (the runtime dtype). It measures how much of a format's
damage comes from the first tokens (attention sinks). "<type>-exactlayersN" (e.g.
tq3_0-exactlayers1/bf16) keeps every row exact in the first N attention layers instead (the
cache's layers are built in order while the pair runs), i.e. a per-layer type of exact/<type>;
"<type>-q8layersN" stores those layers' rows as q8_0 instead (quantized and dequantized on write);
a -sinkN suffix combines with either. `QuantizedAttentionCache.__init__`,
`_Rows.write` and `_Rows.read` are patched while that pair runs.
"""

from __future__ import annotations

import contextlib
import re

import torch

from treeflash.kernels.kv import kv_formats as formats

NOROT = "tq3_0-norot"  # tq3_0 with the rotation replaced by the identity


@contextlib.contextmanager
def _no_rotation():
    """formats.rotate / unrotate -> identity (tq3_0's reference quantizer without the rotation)."""
    saved = formats.rotate, formats.unrotate
    formats.rotate = formats.unrotate = lambda x: x.float()
    try:
        yield
    finally:
        formats.rotate, formats.unrotate = saved


def _split_pair(pair: str) -> tuple[str, str, bool]:
    """'k/v' -> (cache_type_k, cache_type_v, no_rotation)."""
    kt, vt = pair.split("/")
    norot = NOROT in (kt, vt)
    if norot and "tq3_0" in (kt, vt):
        raise ValueError(f"{pair}: tq3_0 and {NOROT} cannot be mixed (the rotation switch is global)")
    return kt.replace(NOROT, "tq3_0"), vt.replace(NOROT, "tq3_0"), norot


SUFFIX_RE = re.compile(r"-(sink|exactlayers|q8layers)(\d+)$")


def _strip_sink(t: str) -> tuple[str, int, int]:
    """'tq3_0-sink4' -> ('tq3_0', 4, 0); 'tq3_0-exactlayers1' -> ('tq3_0', 0, 1); 'tq3_0-q8layers1' -> ('tq3_0', 0, -1);
    'q8_0' -> ('q8_0', 0, 0). A negative layer count: those layers' rows go through q8_0 instead of staying exact."""
    opts = {"sink": 0, "exactlayers": 0, "q8layers": 0}
    while m := SUFFIX_RE.search(t):
        opts[m.group(1)] = int(m.group(2))
        t = t[: m.start()]
    if opts["exactlayers"] and opts["q8layers"]:
        raise ValueError(f"{t}: -exactlayers and -q8layers cannot be combined")
    return t, opts["sink"], opts["exactlayers"] or -opts["q8layers"]


def _sinks(pair: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """'k/v' -> ('k/v' without the suffixes, (sink N of K, of V), (exact first layers of K, of V))."""
    (kt, nk, lk), (vt, nv, lv) = (_strip_sink(t) for t in pair.split("/"))
    return f"{kt}/{vt}", (nk, nv), (lk, lv)


@contextlib.contextmanager
def _exact_sink_rows(nk: int, nv: int, lk: int = 0, lv: int = 0):
    """Compressed caches built while active keep the K rows of positions < nk and the V rows of
    positions < nv exact (as written, fp32) and read them back in place of their dequantized rows;
    in the first lk (lv) caches built (the pair's one model cache: its first attention layers) every
    K (V) row is kept exact; lk (lv) < 0: the first -lk (-lv) layers' rows are kept as q8_0 would
    store them (quantized and dequantized on write) instead of exact."""
    from treeflash.kv import quantized

    if not (nk or nv or lk or lv):
        yield
        return
    init, write, read = quantized.QuantizedAttentionCache.__init__, quantized._Rows.write, quantized._Rows.read
    built = [0]

    def init_(self, num_kv_heads, head_dim, spec):
        init(self, num_kv_heads, head_dim, spec)
        layer, built[0] = built[0], built[0] + 1
        for rows, n, nl in ((self.k, nk, lk), (self.v, nv, lv)):
            rows.sink, rows.sink_rows = (spec.max_len if layer < abs(nl) else n), None
            rows.sink_q8 = nl < 0 and layer < -nl

    def write_(self, slots, x, use_kernel):
        write(self, slots, x, use_kernel)
        n = getattr(self, "sink", 0)
        if not n:
            return
        if self.sink_rows is None:
            self.sink_rows = torch.zeros(n, *x.shape[1:], dtype=torch.float32, device=x.device)
        if self.sink_q8:
            x = formats.dequantize("q8_0", *formats.quantize("q8_0", x.float()))
        if isinstance(slots, int):
            hi = min(n, slots + x.shape[0])
            if hi > slots:
                self.sink_rows[slots:hi] = x[: hi - slots].float()
        else:
            sel = slots < n
            self.sink_rows[slots[sel]] = x[sel].float()

    def read_(self, length, dtype):
        out = read(self, length, dtype)
        n = min(getattr(self, "sink", 0), length)
        if not n or self.sink_rows is None:
            return out
        return torch.cat((self.sink_rows[:n].to(dtype), out[n:]))

    quantized.QuantizedAttentionCache.__init__, quantized._Rows.write, quantized._Rows.read = init_, write_, read_
    try:
        yield
    finally:
        quantized.QuantizedAttentionCache.__init__, quantized._Rows.write, quantized._Rows.read = init, write, read


@contextlib.contextmanager
def variant(pair: str):
    """Run a pair: yields (cache_type_k, cache_type_v) with the bench-only variants patched in."""
    base, (nk, nv), (lk, lv) = _sinks(pair)
    kt, vt, norot = _split_pair(base)
    with _no_rotation() if norot else contextlib.nullcontext(), _exact_sink_rows(nk, nv, lk, lv):
        yield kt, vt
