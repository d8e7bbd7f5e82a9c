"""Launch configurations of the quant kernels: frozen, validated, chosen per shape from a small table.

`QuantTuning` is passed down to `quant_matmul` (default: DEFAULT_TUNING); the measured table entries
come from bench/quant_gemv.py --configs on the target GPU. Nothing here changes at run time.
"""

from __future__ import annotations

from dataclasses import dataclass


def _pow2(name: str, v: int, lo: int, hi: int) -> None:
    if not (lo <= v <= hi and v & (v - 1) == 0):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}], got {v}")


def _split(min_programs: int, num_stages: int | None = None) -> None:
    """The checks every config with a split over K (and a software pipeline) shares."""
    if num_stages is not None and not 1 <= num_stages <= 6:
        raise ValueError(f"num_stages must be in [1, 6], got {num_stages}")
    if min_programs < 1:
        raise ValueError(f"min_programs must be >= 1, got {min_programs}")


@dataclass(frozen=True)
class GemvConfig:
    """M == 1: BLOCK_N output rows per program, UNROLL blocks per loop step (more loads in flight).
    The default gives each thread 8-16 contiguous bytes of a group (16 rows x 32 bytes over 64
    threads): Q4_K's codes then load as 16-byte vectors (tests/kernels/quant/test_compile.py);
    with 8 rows over 128 threads they were single bytes. Not yet timed on a GPU."""
    block_n: int = 16
    unroll: int = 2
    num_warps: int = 2

    def __post_init__(self):
        _pow2("block_n", self.block_n, 1, 128)
        _pow2("unroll", self.unroll, 1, 8)
        _pow2("num_warps", self.num_warps, 1, 16)


@dataclass(frozen=True)
class Q4kGemvConfig:
    """M == 1 for Q4_K through gemv_q4k (32-bit words): BLOCK_N rows per program (two threads a row,
    16 bytes each per load), UNROLL blocks per loop step, and a split over K chosen so that at least
    min_programs programs run (a divisor of the block count: a fixed reduction order)."""
    block_n: int = 16
    unroll: int = 2
    num_warps: int = 1
    min_programs: int = 2048
    # x loaded in the code tile's layout (no shared-memory shuffle and barrier per x vector, in the
    # PTX); not yet timed on a GPU: bench/quant_gemv.py --q4k-ab times it against the default
    x_tile: bool = False

    def __post_init__(self):
        _pow2("block_n", self.block_n, 2, 128)
        _pow2("unroll", self.unroll, 1, 8)
        _pow2("num_warps", self.num_warps, 1, 16)
        _split(self.min_programs)


@dataclass(frozen=True)
class RowsConfig:
    """2 <= M <= max_rows: a BLOCK_M x BLOCK_N output tile per program (tl.dot: both >= 16)."""
    block_m: int = 16
    block_n: int = 32
    num_warps: int = 4

    def __post_init__(self):
        _pow2("block_m", self.block_m, 16, 128)
        _pow2("block_n", self.block_n, 16, 256)
        _pow2("num_warps", self.num_warps, 1, 16)


@dataclass(frozen=True)
class Q4kRowsConfig:
    """2 <= M <= max_rows for Q4_K through rows_q4k: BLOCK_N weight rows x BLOCK_M rows of x per program
    (BLOCK_M the smallest power of two >= M, at least 16, at most block_m), num_stages of Triton's
    software pipelining over the blocks, and a split over K chosen so that at least min_programs
    programs run (a divisor of the block count; 1: never split). Not yet timed on a GPU."""
    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    min_programs: int = 264  # two programs per SM of an H200 (132 SMs)

    def __post_init__(self):
        _pow2("block_m", self.block_m, 16, 128)
        _pow2("block_n", self.block_n, 16, 256)
        _pow2("num_warps", self.num_warps, 1, 16)
        _split(self.min_programs, self.num_stages)


@dataclass(frozen=True)
class Q4kMmaConfig:
    """Q4_K through mma_q4k (exact codes into the tensor cores, scales after the dot): BLOCK_N weight
    rows per program (64 a warpgroup), num_stages of software pipelining, the split over K as in
    Q4kRowsConfig, and at M == 1 the form of the per-group scaling (mma_q4k.MMA_SCALES)."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    min_programs: int = 528
    scale: str = "diag"
    # "diag": the group sums of x from a second tl.dot against ones (True) or from a reduction per group
    sums_dot: bool = True

    def __post_init__(self):
        _pow2("block_n", self.block_n, 16, 256)
        _pow2("num_warps", self.num_warps, 1, 16)
        _split(self.min_programs, self.num_stages)
        if self.scale not in ("group", "diag"):
            raise ValueError(f"scale must be group or diag, got {self.scale!r}")


@dataclass(frozen=True)
class Dp4aConfig:
    """M == 1 through the dp4a kernels (dp4a_q4k, dp4a_q6k, dp4a_q3k, dp4a_q8_0: x rounded to 8 bits per group of
    32, integer dots): BLOCK_N rows per program, UNROLL blocks per loop step (dp4a_q4k, dp4a_q3k), and the split
    over K as in Q4kGemvConfig."""
    block_n: int = 64
    unroll: int = 2
    num_warps: int = 4
    # 32 programs per SM of an H200: at 1056, 27B gate_up took 52.3 us, at 4224 45.7 (bench/results/quant_dp4a_m1.json)
    min_programs: int = 4224
    # load block b + 1 before computing block b (dp4a_q4k; unroll ignored); not yet timed (bench/quant_gemv.py --rows-ab --ms 1)
    prefetch: bool = False
    # the split over K added by the tile's last program (kernels/quant/split_k.py) instead of a split-sum launch
    # (312 launches, 1.4 ms of the 27B Q4_K_M step); off until timed and checked on a GPU (STAGES=dp4a_fused)
    fused_split: bool = False

    def __post_init__(self):
        _pow2("block_n", self.block_n, 2, 256)
        _pow2("unroll", self.unroll, 1, 8)
        _pow2("num_warps", self.num_warps, 1, 16)
        _split(self.min_programs)


@dataclass(frozen=True)
class MmqConfig:
    """2 <= M <= max_rows through the mmq kernels (mmq_q4k, mmq_q6k: x rounded to 8 bits per group of 32 as the
    dp4a kernels round it, int8 tensor-core dots per group, the scales after): BLOCK_N weight rows x BLOCK_M rows
    of x per program (BLOCK_M the smallest power of two >= M, at least 16, at most block_m), num_warps per 32 rows
    of that tile (mmq_q4k.warps_for: BLOCK_M = 64 launches twice as many), num_stages of software pipelining, and a
    split over K chosen so that at least min_programs programs run counting the weight rows' programs only (never
    M's: a row's sums then do not depend on M). block_m 128 spills registers on sm_90 (16 warps). Not yet timed
    on a GPU."""
    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    min_programs: int = 264  # two programs per SM of an H200 (132 SMs)

    def __post_init__(self):
        _pow2("block_m", self.block_m, 16, 128)
        _pow2("block_n", self.block_n, 16, 256)
        _pow2("num_warps", self.num_warps, 1, 8)
        if self.num_warps * max(1, self.block_m // 32) > 16:
            raise ValueError(f"num_warps {self.num_warps} per 32 rows at block_m {self.block_m} exceeds 16 warps")
        _split(self.min_programs, self.num_stages)


# the kernels Q4_K takes at 2 <= M <= max_rows: kernels.rows_kernel, rows_q4k, dequantized tiles + torch matmul,
# mma_q4k, or mmq_q4k (x rounded to 8 bits per group of 32, int8 tensor-core dots)
Q4K_ROWS_ROUTES = ("generic", "q4k", "tiled", "mma", "mmq")
# the kernels Q4_K takes at M == 1: gemv_q4k (32-bit words), kernels.gemv_kernel (byte-wise), or rows_q4k
# (x padded to 16 rows: its block loads are software-pipelined into a tl.dot, which the GEMVs' are not)
# or dp4a_q4k (x rounded to 8 bits per group of 32, integer dot products)
# or q4k_lanes_kernel ("lanes": dp4a_q4k with eight threads a row, a warp load = four rows x 128 contiguous bytes)
Q4K_GEMV_ROUTES = ("words", "bytes", "q4k", "mma", "dp4a", "lanes")
# the kernels Q6_K takes at 2 <= M <= max_rows: kernels.rows_kernel, dequantized tiles + torch matmul, rows_q6k,
# or mmq_q6k (x rounded to 8 bits per group of 32, int8 tensor-core dots)
Q6K_ROWS_ROUTES = ("generic", "tiled", "q6k", "mmq")
# the kernels Q6_K takes at M == 1: kernels.gemv_kernel (byte-wise), or rows_q6k (x padded to 16 rows)
# or dp4a_q6k (x rounded to 8 bits per group of 32, integer dot products; rows of an even number of blocks), one
# row a thread ("dp4a") or eight lanes a row ("lanes")
Q6K_GEMV_ROUTES = ("bytes", "q6k", "dp4a", "lanes")


# the kernels Q8_0 takes at M == 1: kernels.gemv_kernel, or dp4a_q8_0 (integer dot products; rows of an even
# number of blocks)
Q8_0_GEMV_ROUTES = ("generic", "dp4a")
# the kernels Q3_K takes at M == 1: kernels.gemv_kernel, or dp4a_q3k (integer dot products; rows of an even number of blocks)
Q3K_GEMV_ROUTES = ("generic", "dp4a")


@dataclass(frozen=True)
class QuantTuning:
    """Which kernel and launch configuration each quant_matmul call takes.

    gemv_table / rows_table: (format, N, K) -> config entries measured on the GPU; other shapes take
    the defaults. Up to max_rows rows take the rows kernel, more dequantize tiles of dequant_rows
    weight rows and use torch matmul. rows_block_m: (bound, BLOCK_M) pairs, the first bound >= M wins
(a table entry's block_n and num_warps are kept)."""
    gemv: GemvConfig = GemvConfig()
    rows: RowsConfig = RowsConfig()
    q4k: Q4kGemvConfig = Q4kGemvConfig()
    # Q4_K at M == 1 (Q4K_GEMV_ROUTES): dp4a_q4k; the 27B Q4_K_M whole model decoded 59.5 tok/s through it, 48.9
    # through mma_q4k and 40.7 through "words" in one run (H200, bench/results/gpu_speed_quant.json)
    q4k_gemv_route: str = "dp4a"
    q4k_rows: Q4kRowsConfig = Q4kRowsConfig()
    q4k_mma: Q4kMmaConfig = Q4kMmaConfig()  # the "mma" routes (mma_q4k)
    q4k_dp4a: Dp4aConfig = Dp4aConfig()  # the "dp4a" route (dp4a_q4k)
    q4k_lanes: Dp4aConfig = Dp4aConfig(block_n=32)  # Q4_K's "lanes" route (dp4a_q4k, eight threads a row)
    q6k_lanes: Dp4aConfig = Dp4aConfig(block_n=8)  # Q6_K's "lanes" route (dp4a_q6k, 32 threads a row)
    q6k_dp4a: Dp4aConfig = Dp4aConfig()  # Q6_K's "dp4a" route (dp4a_q6k; unroll and prefetch unused)
    # Q8_0 at M == 1 (Q8_0_GEMV_ROUTES): the generic GEMV ran the 27B's 96-row alpha / beta projections as 6 programs
    # walking all of K (74 us each, bench/results/profile_27b_q4_k_m.json); dp4a splits K over the GPU
    q8_0_gemv_route: str = "dp4a"
    q8_0_dp4a: Dp4aConfig = Dp4aConfig()
    # Q3_K at M == 1 (Q3K_GEMV_ROUTES): dp4a_q3k measured 3-6x the generic GEMV on the 27B projections (H200, 2026-12-04:
    # gate_up 37.1 vs 168.8 us, down 26.4 vs 153.1)
    q3k_gemv_route: str = "dp4a"
    q3k_dp4a: Dp4aConfig = Dp4aConfig()
    # Q6_K at 2 <= M <= max_rows (Q6K_ROWS_ROUTES)
    q6k_rows_route: str = "q6k"
    # Q6_K at M == 1 (Q6K_GEMV_ROUTES): dp4a_q6k; the 27B Q4_K_M whole model decoded 87.9 tok/s through it, 73.1 through
    # "q6k" (rows_q6k) in the same run; UD-Q3_K_XL 76.0 against 67.9 (H200, bench/results/gpu_speed_quant*.json)
    q6k_gemv_route: str = "dp4a"
    # Q4_K at 2 <= M <= max_rows (Q4K_ROWS_ROUTES): rows_q4k (M = 32: 2-5x the generic kernel, bench/results/quant_mma_ab.json)
    q4k_rows_route: str = "q4k"
    q4k_mmq: MmqConfig = MmqConfig()  # Q4_K's "mmq" rows route (mmq_q4k)
    q6k_mmq: MmqConfig = MmqConfig()  # Q6_K's "mmq" rows route (mmq_q6k)
    gemv_table: tuple[tuple[str, int, int, GemvConfig], ...] = ()
    rows_table: tuple[tuple[str, int, int, RowsConfig], ...] = ()
    rows_block_m: tuple[tuple[int, int], ...] = ((16, 16), (32, 32), (128, 64))
    max_rows: int = 128
    dequant_rows: int = 4096

    def __post_init__(self):
        if not 1 <= self.max_rows <= 1024:
            raise ValueError(f"max_rows must be in [1, 1024], got {self.max_rows}")
        if self.q4k_gemv_route not in Q4K_GEMV_ROUTES:
            raise ValueError(f"q4k_gemv_route must be one of {', '.join(Q4K_GEMV_ROUTES)}, got {self.q4k_gemv_route!r}")
        if self.q4k_rows_route not in Q4K_ROWS_ROUTES:
            raise ValueError(f"q4k_rows_route must be one of {', '.join(Q4K_ROWS_ROUTES)}, got {self.q4k_rows_route!r}")
        if self.q6k_rows_route not in Q6K_ROWS_ROUTES:
            raise ValueError(f"q6k_rows_route must be one of {', '.join(Q6K_ROWS_ROUTES)}, got {self.q6k_rows_route!r}")
        if self.q6k_gemv_route not in Q6K_GEMV_ROUTES:
            raise ValueError(f"q6k_gemv_route must be one of {', '.join(Q6K_GEMV_ROUTES)}, got {self.q6k_gemv_route!r}")
        if self.q8_0_gemv_route not in Q8_0_GEMV_ROUTES:
            raise ValueError(f"q8_0_gemv_route must be one of {', '.join(Q8_0_GEMV_ROUTES)}, got {self.q8_0_gemv_route!r}")
        if self.q3k_gemv_route not in Q3K_GEMV_ROUTES:
            raise ValueError(f"q3k_gemv_route must be one of {', '.join(Q3K_GEMV_ROUTES)}, got {self.q3k_gemv_route!r}")
        if self.dequant_rows < 1:
            raise ValueError(f"dequant_rows must be positive, got {self.dequant_rows}")
        if not self.rows_block_m or self.rows_block_m[-1][0] < self.max_rows:
            raise ValueError("rows_block_m must cover M up to max_rows")
        for bound, bm in self.rows_block_m:
            _pow2("rows_block_m block", bm, 16, 128)

    def gemv_config(self, fmt: str, n: int, k: int) -> GemvConfig:
        return next((c for f, tn, tk, c in self.gemv_table if (f, tn, tk) == (fmt, n, k)), self.gemv)

    def rows_config(self, fmt: str, n: int, k: int, m: int) -> RowsConfig:
        cfg = next((c for f, tn, tk, c in self.rows_table if (f, tn, tk) == (fmt, n, k)), self.rows)
        bm = next(bm for bound, bm in self.rows_block_m if m <= bound)
        return cfg if cfg.block_m == bm else RowsConfig(bm, cfg.block_n, cfg.num_warps)


DEFAULT_TUNING = QuantTuning()


def split_for(nb: int, programs: int, min_programs: int) -> int:
    """The largest divisor of nb (blocks per row) that keeps programs * split <= max(programs, min_programs)."""
    want = max(1, min_programs // programs)
    return max(d for d in range(1, nb + 1) if nb % d == 0 and d <= want)
