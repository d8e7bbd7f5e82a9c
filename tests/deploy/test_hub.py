"""--model org/name and --model org/name:file.gguf fetch through huggingface_hub from a real HTTP Hub
(tests/deploy/hub_server.py on 127.0.0.1, reached through HF_ENDPOINT) into the standard cache, and
the model they load is the one the same files load from a local path.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE when it is imported, so every
download runs in a fresh `treeflash` process with its own environment.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.hub_server import HubServer
from tests.models.test_loaders import random_hf, save_hf, write_gguf
from treeflash.cli.main import main
from treeflash.cli.serve import served_name
from treeflash.errors import ModelLoadError
from treeflash.models.hub import HubModel, parse_hub_id, resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
PROMPT = ["--prompt", "w1 w2 w3 w4", "--max-tokens", "8", "--ignore-eos", "--quiet", "--threads", "1"]
# huggingface_hub writes what it receives in 10 MiB chunks (DOWNLOAD_CHUNK_SIZE), so the weights are ~20 MB and the
# first transfer drops after 12 MB: one chunk is on disk, and the retry must ask for the rest with a Range header
CHUNK = 10 * 1024 * 1024
WEIGHTS_CUT = 12_000_000


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    hf = random_hf("llama", hidden_size=128, intermediate_size=4096)
    repo = save_hf(hf, base / "llama")
    (repo / "pytorch_model.bin").write_bytes(b"a pickle: never fetched")
    (repo / "modeling_evil.py").write_text("raise SystemExit('checkpoint code ran')\n")
    gguf_dir = base / "llama-gguf"
    gguf_dir.mkdir()
    write_gguf(gguf_dir / "tiny-Q8_0.gguf", random_hf("llama"))
    (gguf_dir / "other-F16.gguf").write_bytes(b"not fetched")
    pickles = base / "pickles"
    pickles.mkdir()
    (pickles / "config.json").write_text((repo / "config.json").read_text())
    (pickles / "pytorch_model.bin").write_bytes(b"x")
    with HubServer() as server:
        server.add("tiny/llama", repo, cut_once={"model.safetensors": WEIGHTS_CUT})
        server.add("tiny/llama-gguf", gguf_dir)
        server.add("tiny/gated", repo, token="hf_secret")
        server.add("tiny/pickles", pickles)
        yield server, base


def local_generate(model: Path, capsys) -> str:
    """The same CLI on a local path, in this process (no Hub involved, so no fresh environment needed)."""
    capsys.readouterr()
    assert main(["generate", "--model", str(model), *PROMPT]) == 0
    return capsys.readouterr().out


RESOLVE = """
import json, sys
from treeflash.errors import ModelLoadError
from treeflash.models.hub import resolve_model_path
out = {}
for model in sys.argv[1:]:
    try:
        out[model] = "ok " + str(resolve_model_path(model))
    except ModelLoadError as e:
        out[model] = "ModelLoadError " + str(e)
print(json.dumps(out))
"""


def resolve_all(models, hf_home: Path, endpoint: str, **env) -> dict[str, str]:
    """resolve_model_path for each model in one fresh process: "ok PATH" or "ModelLoadError MESSAGE"."""
    environ = _environ(hf_home, endpoint, **env)
    r = subprocess.run([sys.executable, "-c", RESOLVE, *models], capture_output=True, text=True, env=environ, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _environ(hf_home: Path, endpoint: str, **env) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ.update(PYTHONPATH=str(ROOT), HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", **env)
    return environ


def treeflash(*args, hf_home: Path, endpoint: str, **env):
    return subprocess.run([sys.executable, "-m", "treeflash.cli.main", *args], capture_output=True, text=True,
                          env=_environ(hf_home, endpoint, **env), timeout=300, cwd=ROOT)


def test_hub_ids_parse_and_local_paths_win(tmp_path, monkeypatch):
    assert parse_hub_id("Qwen/Qwen3-0.6B") == HubModel("Qwen/Qwen3-0.6B")
    assert parse_hub_id("unsloth/Qwen3-8B-GGUF:Qwen3-8B-Q4_K_M.gguf") == HubModel("unsloth/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf")
    assert parse_hub_id("org/m:sub/dir/m-Q8_0.gguf@v1.0") == HubModel("org/m", "sub/dir/m-Q8_0.gguf", "v1.0")
    for not_hub in ("./org/name", "/abs/org/name", "~/org/name", "name", "org/name/extra", "../org/name", "org/name:file.bin"):
        assert parse_hub_id(not_hub) is None, not_hub
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert resolve_model_path("org/name") == Path("org/name")  # an existing directory is never looked up
    assert served_name("org/name") == "name"
    assert served_name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # the repository id, as clients name it
    assert served_name("unsloth/Qwen3-8B-GGUF:Qwen3-8B-Q4_K_M.gguf") == "Qwen3-8B-Q4_K_M"
    assert served_name("./missing/model.gguf") == "model"


def test_safetensors_repo_downloads_resumes_and_generates_as_the_local_copy(hub, tmp_path, capsys):
    server, base = hub
    hf_home = tmp_path / "hf"
    fetched = treeflash("generate", "--model", "tiny/llama", *PROMPT, hf_home=hf_home, endpoint=server.url)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.strip() and fetched.stdout == local_generate(base / "llama", capsys)
    # the standard cache layout, at the served commit
    snapshot = hf_home / "hub" / "models--tiny--llama" / "snapshots" / server.repos["tiny/llama"].sha
    assert {p.name for p in snapshot.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert (snapshot / "model.safetensors").read_bytes() == (base / "llama" / "model.safetensors").read_bytes()
    # the first transfer of the weights broke mid-body; the retry asked only for the rest
    weights = [(m, r) for m, p, r, _ in server.log if p == "/tiny/llama/resolve/" + server.repos["tiny/llama"].sha + "/model.safetensors"]
    assert (base / "llama" / "model.safetensors").stat().st_size > WEIGHTS_CUT
    assert weights == [("HEAD", None), ("GET", None), ("GET", f"bytes={CHUNK}-")], weights
    # pickles and checkpoint code are never fetched
    assert not [p for _, p, _, _ in server.log if p.endswith((".bin", ".py"))]

    # offline: the cache alone, no request made (the endpoint is a closed port besides)
    offline = treeflash("generate", "--model", "tiny/llama", *PROMPT, hf_home=hf_home, endpoint="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == fetched.stdout


def test_gguf_file_from_a_repo(hub, tmp_path, capsys):
    server, base = hub
    hf_home = tmp_path / "hf"
    fetched = treeflash("generate", "--model", "tiny/llama-gguf:tiny-Q8_0.gguf", *PROMPT, hf_home=hf_home, endpoint=server.url)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.strip() and fetched.stdout == local_generate(base / "llama-gguf" / "tiny-Q8_0.gguf", capsys)
    blobs = list((hf_home / "hub" / "models--tiny--llama-gguf" / "blobs").iterdir())
    assert len(blobs) == 1  # only the file asked for
    assert not [p for _, p, _, _ in server.log if p.endswith("other-F16.gguf")]


def test_token_gated_repo_and_clear_errors(hub, tmp_path):
    server, _ = hub
    hf_home = tmp_path / "hf"
    expected = {
        "tiny/gated": "the repository is gated",
        "tiny/nope": "no such repository",
        "tiny/llama-gguf:absent.gguf": "has no file 'absent.gguf'",
        "tiny/llama@v9": "no revision 'v9'",
        "tiny/pickles": "no *.safetensors weights",
    }
    got = resolve_all(expected, hf_home, server.url)
    for model, message in expected.items():
        assert got[model].startswith("ModelLoadError ") and message in got[model], (model, got[model])
    offline = resolve_all(["tiny/llama"], hf_home, server.url, HF_HUB_OFFLINE="1")
    assert "not in the local Hub cache" in offline["tiny/llama"]
    with_token = resolve_all(["tiny/gated"], hf_home, server.url, HF_TOKEN="hf_secret")["tiny/gated"]
    assert with_token.startswith("ok ") and Path(with_token[3:], "model.safetensors").is_file()
    assert "Bearer hf_secret" in {a for _, p, _, a in server.log if p.startswith("/api/models/tiny/gated")}
    # the CLI turns the typed error into its one-line message and exit status 2
    r = treeflash("serve", "--model", "tiny/nope", "--port", "0", hf_home=hf_home, endpoint=server.url)
    assert r.returncode == 2 and "no such repository" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_resolve_in_process_reports_the_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or directory"):
        from treeflash.models.loader import open_checkpoint

        open_checkpoint(tmp_path / "absent")
