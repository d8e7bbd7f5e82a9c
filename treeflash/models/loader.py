"""load_model: a Hugging Face directory, a GGUF file, or the embedded default -> a ready CausalLM.

Every format reader (hf_loader, gguf_loader) opens its files into one `Checkpoint`: a ModelConfig,
the tensors under our (= Hugging Face) names with their shapes and a way to read each one, and
the tokenizer. This module then builds the model on the meta device (no memory, no random init),
checks names and shapes strictly before reading anything, and streams the tensors in one by one,
so a checkpoint never sits in memory twice.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from treeflash.errors import InvalidRequestError, ModelLoadError
from treeflash.models.checkpoint import Checkpoint
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
    weights: str = "float"  # "int4": 4-bit linear layers on the CPU (models/int4_linear.py)


WEIGHT_FORMATS = ("float", "int4")


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
) -> LoadedModel:
    """Load a model for inference. `path` None -> the embedded default (SmolLM2-135M-Instruct, Q4_1 GGUF).

    dtype defaults to float32 on a CPU and bfloat16 on a GPU. Raises ModelLoadError naming the file
    and the tensor for anything that does not fit the architecture exactly. weights="int4" keeps
    4-bit (Q4_0/Q4_1) linear layers at 4 bits on the CPU (see models/int4_linear.py).
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
    model = build_model(ckpt, dev, dtype, progress)
    if weights == "int4":
        from treeflash.models.int4_linear import use_int4_model

        stats = use_int4_model(model)
        if not stats["int4"]:
            raise InvalidRequestError(f"--weights int4: no linear layer of {ckpt.source} is 4-bit (Q4_0/Q4_1 GGUF blocks); use --weights float", "weights")
    return LoadedModel(model=model, tokenizer=tokenizer, chat_template=ckpt.chat_template, config=ckpt.config, source=ckpt.source, weights=weights)


def build_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype, progress: bool = True) -> CausalLM:
    config = ckpt.config
    with _empty_weights():
        model = CausalLM(config)
    mtp_names = {n for n in ckpt.tensors if n.startswith(MTP_PREFIX)}
    if mtp_names and config.mtp_num_layers > 0:
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
