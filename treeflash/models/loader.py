"""load_model: a Hugging Face directory, a GGUF file, or the embedded default -> a ready CausalLM.

Every format reader (hf_loader, gguf_loader) opens its files into one `Checkpoint`: a ModelConfig,
the tensors under our (= Hugging Face) names with their shapes and a way to read each one, and
the tokenizer. This module then builds the model on the meta device (no memory, no random init),
checks names and shapes strictly before reading anything, and streams the tensors in one by one,
so a checkpoint never sits in memory twice.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from treeflash.errors import InvalidRequestError, ModelLoadError
from treeflash.models.checkpoint import Checkpoint, TensorRef
from treeflash.models.config import ModelConfig
from treeflash.models.layers import Rotary
from treeflash.models.transformer import CausalLM

MTP_PREFIX = "mtp."


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Any  # a transformers fast tokenizer
    chat_template: str | None
    config: ModelConfig
    source: str
    weights: str = "float"  # WEIGHT_FORMATS
    weight_plan: dict[str, dict[str, int]] = field(default_factory=dict)  # stored type -> {"quantized": n, "dequantized": n}


# float: every tensor dequantized to the model dtype. native: GGUF blocks kept as stored where a fast path
# runs them (CUDA: treeflash.kernels.quant's kernels, per format; CPU: the int4 kernel for Q4_0/Q4_1), the
# rest dequantized. int4: the CPU int4 path, an error where no layer is 4-bit.
WEIGHT_FORMATS = ("float", "native", "int4")


def resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Dispatch on the path: a directory is a Hugging Face checkpoint, a *.gguf file a GGUF one.
    A path that does not exist but reads as a Hub id (org/name, org/name:file.gguf) is fetched first."""
    from treeflash.models.hub import resolve_model_path

    p = resolve_model_path(path)
    if p.is_dir():
        from treeflash.models.hf_loader import open_hf_dir

        return open_hf_dir(p)
    if p.is_file() and p.suffix.lower() == ".gguf":
        from treeflash.models.gguf_loader import open_gguf

        return open_gguf(p)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory; pass a Hugging Face model directory, a .gguf file, "
                             f"or a Hub id (org/name, org/name:file.gguf)")
    raise ModelLoadError(f"{p}: not a model; pass a Hugging Face model directory (config.json + *.safetensors) or a .gguf file")


def load_model(
    path: str | None,
    device: str | torch.device = "auto",
    dtype: torch.dtype | None = None,
    progress: bool = True,
    weights: str = "float",
    mtp: bool = True,
) -> LoadedModel:
    """Load a model for inference. `path` None -> the embedded default (SmolLM2-135M-Instruct, Q4_1 GGUF).

    dtype defaults to float32 on a CPU and bfloat16 on a GPU. Raises ModelLoadError naming the file
    and the tensor for anything that does not fit the architecture exactly. weights="int4" keeps
    4-bit (Q4_0/Q4_1) linear layers at 4 bits on the CPU (see models/int4_linear.py); weights="native"
    keeps each GGUF linear weight in its stored blocks where a fast path runs its format (on CUDA a
    QuantLinear for the formats treeflash.kernels.quant has kernels for; on the CPU int4), the rest
    dequantized. `weight_plan` of the result says, per stored type, how many tensors went which way.
    mtp=False leaves a checkpoint's MTP head (mtp.* weights) unread: only `--draft mtp` runs it (the 27B
    shape's is 0.85 GB read float).
    """
    if weights not in WEIGHT_FORMATS:
        raise InvalidRequestError(f"--weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}", "weights")
    if path is None:
        from treeflash.models.default_model import default_model_path

        path = str(default_model_path())
    dev = resolve_device(device)
    if dtype is None:
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    ckpt = open_checkpoint(path)
    tokenizer = ckpt.load_tokenizer()  # before the weights: a broken tokenizer should fail fast
    if weights == "int4" and dev.type != "cpu":
        raise InvalidRequestError(f"--weights int4 runs on the CPU only (device {dev}); on a GPU the weights are {dtype}", "weights")
    keep = None
    if weights == "native" and dev.type == "cuda":
        from treeflash.kernels.quant import FORMATS, has_kernel

        keep = lambda fmt: fmt in FORMATS and has_kernel(fmt)  # noqa: E731 (other block types are dequantized)
    elif weights == "native":
        from treeflash.models.int4_linear import INT4_FORMATS, int4_kernel_available

        keep = INT4_FORMATS.__contains__ if int4_kernel_available() else None
    # the embedding stays in blocks on CUDA (a lookup dequantizes its rows there in one kernel); the CPU's int4 path reads a float table
    model = build_model(ckpt, dev, dtype, progress, keep_quantized=keep, keep_embedding=keep is not None and dev.type == "cuda",
                        mtp=mtp)
    if weights == "native":
        model.weights_format = "native"  # what bench/machine reports
    if weights == "native" and dev.type == "cpu" and keep is not None:
        from treeflash.models.int4_linear import use_int4_blocks

        use_int4_blocks(model)  # the CPU runs 4-bit blocks through torch's int4 kernel, never dequantize-per-call
    if weights == "int4":
        from treeflash.models.int4_linear import use_int4_model

        stats = use_int4_model(model)
        if not stats["int4"]:
            raise InvalidRequestError(f"--weights int4: no linear layer of {ckpt.source} is 4-bit (Q4_0/Q4_1 GGUF blocks); use --weights float", "weights")
    plan = weight_plan(ckpt, model)
    if progress and weights != "float" and plan:
        print(format_weight_plan(plan, dev), file=sys.stderr, flush=True)
    return LoadedModel(model=model, tokenizer=tokenizer, chat_template=ckpt.chat_template, config=ckpt.config, source=ckpt.source,
                       weights=weights, weight_plan=plan)


def format_weight_plan(plan: dict[str, dict[str, int]], device: torch.device) -> str:
    """The weight plan as a few lines: per stored type, how many matrices run quantized on `device`."""
    rows = [f"  {t:8s} {c['quantized']:4d} kept quantized, {c['dequantized']:4d} dequantized" for t, c in sorted(plan.items())]
    return "\n".join([f"weights on {device.type} (per GGUF type):", *rows])


def weight_plan(ckpt: Checkpoint, model: CausalLM) -> dict[str, dict[str, int]]:
    """Per stored GGUF block type: how many tensors the model runs quantized (GGUF blocks or int4 codes)
    and how many it holds dequantized. Empty for a float checkpoint (and F32/F16/BF16 tensors are left out)."""
    from treeflash.models.gguf_dequant import FLOAT_TYPES, type_name
    from treeflash.models.packed_linear import PackedLinear

    packed = {name for name, m in model.named_modules() if isinstance(m, PackedLinear)}
    plan: dict[str, dict[str, int]] = {}
    for name, ref in ckpt.tensors.items():
        if ref.ggml_type is None or ref.ggml_type in FLOAT_TYPES:
            continue
        row = plan.setdefault(type_name(ref.ggml_type), {"quantized": 0, "dequantized": 0})
        row["quantized" if name.rpartition(".")[0] in packed else "dequantized"] += 1
    return plan


def build_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype, progress: bool = True,
                keep_quantized: Callable[[str], bool] | None = None, keep_embedding: bool = False, mtp: bool = True) -> CausalLM:
    """The model with every tensor read onto `device`. keep_quantized(fmt): which GGUF block formats an
    nn.Linear weight keeps as stored (the layer becomes a models.quant_linear.QuantLinear); None: none.
    keep_embedding: the token embedding too, where keep_quantized takes its format (a
    models.quant_embedding.QuantEmbedding; a tied head then multiplies by the same blocks). mtp: build and
    read the MTP head where the checkpoint has one (else its tensors are skipped)."""
    config = ckpt.config
    with _empty_weights():
        model = CausalLM(config)
    mtp_names = {n for n in ckpt.tensors if n.startswith(MTP_PREFIX)}
    if mtp and mtp_names and config.mtp_num_layers > 0:
        head = _new_mtp_head(config)
        if head is not None:
            model.mtp = head
    if model.mtp is None:
        ckpt.skipped.extend(sorted(mtp_names))  # kept aside: nothing here consumes them
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    _check_names_and_shapes(ckpt, expected)

    from tqdm.auto import tqdm

    names = list(expected)
    with torch.no_grad():
        for name in tqdm(names, desc=f"loading {Path(ckpt.source).name}", unit="tensor", disable=not progress):
            ref = ckpt.tensors[name]
            if keep_quantized is not None and _keep_blocks(model, name, ref, device, dtype, keep_quantized, keep_embedding):
                continue
            try:
                value = ref.read(device, dtype)
            except ModelLoadError:
                raise
            except Exception as e:  # a corrupt or truncated file surfaces here
                raise ModelLoadError(f"{ckpt.source}: cannot read tensor {ref.origin}: {e}") from e
            if tuple(value.shape) != expected[name]:
                raise ModelLoadError(f"{ckpt.source}: tensor {ref.origin} has shape {tuple(value.shape)}, expected {expected[name]}")
            _assign(model, name, value)
        _move_buffers(model, device)
        if ckpt.rope_freq_factors is not None:
            factors = ckpt.rope_freq_factors.read(device, torch.float32)
            for m in model.modules():
                if isinstance(m, Rotary):
                    if m.inv_freq.shape != factors.shape:
                        raise ModelLoadError(f"{ckpt.source}: {ckpt.rope_freq_factors.origin} has shape {tuple(factors.shape)}, expected {tuple(m.inv_freq.shape)}")
                    m.inv_freq = m.inv_freq / factors
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_meta:
            raise ModelLoadError(f"{ckpt.source}: {name} was not loaded")
    model.requires_grad_(False)
    return model.eval()


def _keep_blocks(model: nn.Module, name: str, ref: TensorRef, device: torch.device, dtype: torch.dtype,
                 keep: Callable[[str], bool], keep_embedding: bool = False) -> bool:
    """Swap the nn.Linear that owns weight `name` for a QuantLinear over the tensor's stored blocks,
    when the tensor has blocks and `keep` takes their format; returns whether it did (its bias, if
    any, is read afterwards like any parameter)."""
    from treeflash.models.gguf_dequant import type_name

    module_path, _, leaf = name.rpartition(".")
    if leaf != "weight" or ref.read_blocks is None or not keep(type_name(ref.ggml_type)):
        return False
    if name.startswith(MTP_PREFIX):  # MTPHead reads fc.weight for its cache's dtype: its matrices stay float
        return False
    parent_path, _, child = module_path.rpartition(".")
    parent = model.get_submodule(parent_path)
    lin = getattr(parent, child)
    if type(lin) is nn.Embedding and keep_embedding:
        return _keep_embedding_blocks(model, parent, child, lin, ref, device, dtype)
    if type(lin) is not nn.Linear:
        return False
    from treeflash.models.quant_linear import QuantLinear

    try:
        q = ref.read_blocks(device)
    except Exception as e:
        raise ModelLoadError(f"cannot read the blocks of tensor {ref.origin}: {e}") from e
    setattr(parent, child, QuantLinear(q.blocks, q.fmt, lin.in_features, bias=lin.bias, in_index=q.in_index))
    return True


def _keep_embedding_blocks(model: nn.Module, parent: nn.Module, child: str, emb: nn.Embedding, ref: TensorRef,
                           device: torch.device, dtype: torch.dtype) -> bool:
    """The token embedding as a QuantEmbedding over its stored blocks (a lookup dequantizes the rows it
    reads); a tied head multiplies by the same blocks (a QuantLinear sharing them), so the table is
    never dequantized whole."""
    from treeflash.models.quant_embedding import QuantEmbedding
    from treeflash.models.quant_linear import QuantLinear

    try:
        q = ref.read_blocks(device)
    except Exception as e:
        raise ModelLoadError(f"cannot read the blocks of tensor {ref.origin}: {e}") from e
    if q.in_index is not None:  # a column permutation cannot move inside a block
        return False
    setattr(parent, child, QuantEmbedding(q.blocks, q.fmt, emb.embedding_dim, dtype))
    if getattr(model, "lm_head", "absent") is None:  # tied
        model.lm_head = QuantLinear(q.blocks, q.fmt, emb.embedding_dim)
    return True


def _check_names_and_shapes(ckpt: Checkpoint, expected: dict[str, tuple[int, ...]]) -> None:
    """Strict: every parameter filled, every checkpoint tensor used (except the known skips)."""
    for name, shape in expected.items():
        ref = ckpt.tensors.get(name)
        if ref is None:
            raise ModelLoadError(f"{ckpt.source}: missing tensor {ckpt.file_name(name)} (for {name})")
        if tuple(ref.shape) != shape:
            raise ModelLoadError(f"{ckpt.source}: tensor {ref.origin} has shape {tuple(ref.shape)}, expected {shape} for {name}")
    skipped = set(ckpt.skipped)
    tied = ckpt.config.tie_word_embeddings
    for name, ref in ckpt.tensors.items():
        if name in expected or name in skipped or (tied and name == "lm_head.weight"):
            continue
        raise ModelLoadError(f"{ckpt.source}: unexpected tensor {ref.origin}: the {ckpt.config.arch} model has no parameter {name}")


def _new_mtp_head(config: ModelConfig) -> nn.Module | None:
    try:
        from treeflash.models.mtp import MTPHead
    except ImportError:
        warnings.warn("treeflash.models.mtp is not available; the checkpoint's mtp.* weights are not loaded", stacklevel=3)
        return None
    with _empty_weights():
        return MTPHead(config, config.mtp_num_layers)


@contextlib.contextmanager
def _empty_weights():
    """Build modules with every parameter on the meta device (no memory, no random init) and every
    buffer (computed tables such as rotary frequencies) for real on the CPU. Parameters are created
    on the CPU uninitialized (untouched pages cost nothing) and swapped for meta ones as they are
    registered: a module built inside `torch.device("meta")` instead would compute its tables
    through torch's reference ops, whose first call imports torch._dynamo (seconds)."""
    init_names = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_")
    saved_init = {n: getattr(nn.init, n) for n in init_names}
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    try:
        for n in init_names:
            setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        nn.Module.register_parameter = register_on_meta
        yield
    finally:
        nn.Module.register_parameter = register
        for n, f in saved_init.items():
            setattr(nn.init, n, f)


def _assign(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_path, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_path)
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[leaf] = value


def _move_buffers(model: nn.Module, device: torch.device) -> None:
    """Computed buffers (not in the checkpoint) were built on the CPU: move them, keeping their dtype."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != device:
                module._buffers[name] = buf.to(device)
