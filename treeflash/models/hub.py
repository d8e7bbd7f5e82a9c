"""Models from the Hugging Face Hub: `org/name` (a safetensors repository) or `org/name:file.gguf`.

A model argument that is not an existing local path and reads as a Hub id is fetched through
huggingface_hub into its standard cache (HF_HOME / HF_HUB_CACHE), and the local snapshot
directory or GGUF file is returned. huggingface_hub supplies what users expect from any Hub
client, so none of it is re-implemented here: progress bars, resuming a partial download
(HTTP Range), HF_TOKEN for gated or private repositories, HF_ENDPOINT for a mirror, and
HF_HUB_OFFLINE=1 to use the cache without touching the network. A local path always wins: the
id is only looked up when no file or directory of that name exists.

Only what the loaders read is fetched: config.json, *.safetensors (+ index), the tokenizer files
and the chat template. Never *.bin / *.pt (pickles) nor *.py: no code from a checkpoint runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from treeflash.errors import ModelLoadError

# the files open_hf_dir reads; everything else in a repository (pickles, code, ONNX, other GGUFs) is skipped
SAFETENSORS_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)

# owner/name as the Hub spells them, an optional :file.gguf (which may sit in a folder), an optional @revision
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<file>[\w./-]+\.gguf))?(?:@(?P<rev>[\w./-]+))?$")


@dataclass(frozen=True)
class HubModel:
    """One model on the Hub: a repository, optionally one GGUF file in it, optionally a revision."""

    repo_id: str  # "org/name"
    filename: str | None = None  # "model-Q4_K_M.gguf"; None: the repository's safetensors checkpoint
    revision: str | None = None  # branch, tag or commit; None: the default branch

    def __str__(self) -> str:
        out = self.repo_id + (f":{self.filename}" if self.filename else "")
        return out + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(model: str) -> HubModel | None:
    """`org/name[:file.gguf][@revision]` -> HubModel; None for anything else (a local path, a typo)."""
    m = _HUB_ID.match(model)
    if m is None or ".." in model or model.startswith(("./", "/", "~")):
        return None
    return HubModel(m["repo"], m["file"], m["rev"])


def resolve_model_path(model: str | Path) -> Path:
    """The local path for a --model argument: itself when it exists, else the Hub download of it.

    Raises ModelLoadError with the Hub's reason (not found, gated, offline and not cached, network)."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    hub = parse_hub_id(str(model))
    if hub is None:
        return path  # open_checkpoint reports the missing path
    fetched = fetch(hub)
    check_fetched(hub, fetched)
    return fetched


def fetch(hub: HubModel) -> Path:
    """Download (or find in the cache) `hub`; returns the snapshot directory or the GGUF file."""
    try:
        import httpx
        import huggingface_hub as hf
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                            RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError as e:  # a dependency of transformers, so present in every install
        raise ModelLoadError(f"{hub}: huggingface_hub is needed to fetch models from the Hub ({e})") from None
    try:
        if hub.filename is not None:
            return Path(hf.hf_hub_download(hub.repo_id, hub.filename, revision=hub.revision))
        return Path(hf.snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=list(SAFETENSORS_FILES)))
    except GatedRepoError as e:
        raise ModelLoadError(f"{hub}: the repository is gated; accept its terms on the Hub and set HF_TOKEN ({_first_line(e)})") from None
    except RepositoryNotFoundError as e:
        raise ModelLoadError(f"{hub}: no such local path, and no such repository on the Hub (or it is private: set HF_TOKEN) "
                             f"({_first_line(e)})") from None
    except RevisionNotFoundError as e:
        raise ModelLoadError(f"{hub}: no revision {hub.revision or 'main'!r} in {hub.repo_id} ({_first_line(e)})") from None
    except RemoteEntryNotFoundError as e:
        raise ModelLoadError(f"{hub}: {hub.repo_id} has no file {hub.filename!r} ({_first_line(e)})") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:  # LocalEntryNotFoundError is a FileNotFoundError: first
        raise ModelLoadError(f"{hub}: not in the local Hub cache and the Hub cannot be reached (HF_HUB_OFFLINE set, or no "
                             f"network): {_first_line(e)}") from None
    except (httpx.HTTPError, OSError, ValueError) as e:  # HfHubHTTPError is an httpx.HTTPError
        raise ModelLoadError(f"{hub}: cannot fetch from the Hub: {type(e).__name__}: {_first_line(e)}") from None


def check_fetched(hub: HubModel, path: Path) -> None:
    """A safetensors repository must have given us a checkpoint (not, say, only pickles)."""
    if hub.filename is None and not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{hub}: the repository has no *.safetensors weights (pickled .bin checkpoints are never loaded); "
                             f"pass org/name:file.gguf for a GGUF repository")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
