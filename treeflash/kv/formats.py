"""KV cache storage formats (type names, byte accounting, plain-torch references): this name is
the module treeflash.kernels.kv_formats itself, not a copy of its names, so that a name patched
here (bench/kv_quality.py swaps `rotate` for the identity) is the one the references call. The
module lives in the kernels layer, whose Triton kernels read and write these layouts."""

import sys

from treeflash.kernels import kv_formats

sys.modules[__name__] = kv_formats
