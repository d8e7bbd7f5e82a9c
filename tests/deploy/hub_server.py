"""A small Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub's downloads call, over real HTTP.

Point HF_ENDPOINT at it. It serves directories as model repositories at one commit each:
  GET  /api/models/{repo}/revision/{rev}   model info: {"id", "sha", "siblings"} (snapshot_download)
  GET  /api/models/{repo}/tree/{rev}       the file list, recursive (snapshot_download)
  HEAD /{repo}/resolve/{rev}/{file}        X-Repo-Commit, ETag (the blob's sha256), Content-Length (hf_hub_download)
  GET  /{repo}/resolve/{rev}/{file}        the bytes; a Range header gets 206 + Content-Range (resume)
Errors carry the X-Error-Code header huggingface_hub maps to its exceptions (RepoNotFound,
RevisionNotFound, EntryNotFound, GatedRepo). A repository may require a token (as a gated one
does), and a file may be cut short once mid-body (the connection drops: a real partial download).
Every request is logged as (method, path, Range header, Authorization header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    root: Path
    sha: str  # the commit every revision name resolves to
    token: str | None = None  # required as "Authorization: Bearer TOKEN" when set (a gated repository)
    cut_once: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before the first full GET is dropped

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None, str | None]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def add(self, repo_id: str, root: Path, token: str | None = None, cut_once: dict[str, int] | None = None) -> Repo:
        sha = hashlib.sha1(repo_id.encode() + b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())).hexdigest()
        self.repos[repo_id] = repo = Repo(root, sha, token, dict(cut_once or {}))
        return repo

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet; hub.log keeps what the tests read
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.log.append((self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo = self._repo("/".join(parts[2:4]), parts[5])
                if repo is None:
                    return
                if parts[4] == "revision":
                    info = {"id": "/".join(parts[2:4]), "sha": repo.sha, "private": repo.token is not None,
                            "siblings": [{"rfilename": f} for f in repo.files()]}
                else:
                    info = [{"type": "file", "path": f, "size": (repo.root / f).stat().st_size, "oid": _git_oid(repo.root / f)}
                            for f in repo.files()]
                return self._json(200, info)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = self._repo("/".join(parts[:2]), parts[3])
                if repo is None:
                    return
                name = "/".join(parts[4:])
                file = repo.root / name
                if name not in repo.files():
                    return self._error(404, "EntryNotFound", f"{name} not in the repository")
                return self._file(repo, name, file, body)
            self._error(404, None, f"no route {path}")

        def _repo(self, repo_id: str, rev: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"no repository {repo_id}")
                return None
            if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(403 if self.headers.get("Authorization") else 401, "GatedRepo", f"{repo_id} is gated")
                return None
            if rev not in ("main", repo.sha):
                self._error(404, "RevisionNotFound", f"no revision {rev}")
                return None
            return repo

        def _file(self, repo: Repo, name: str, file: Path, body: bool) -> None:
            data = file.read_bytes()
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start, status = int(rng[len("bytes="):-1]), 206
            self.send_response(status)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            cut = repo.cut_once.pop(name, None) if start == 0 else None
            if cut is not None:  # the first full download of this file breaks after `cut` bytes
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(data[start:])

        def _json(self, status: int, obj) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        def _error(self, status: int, code: str | None, message: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


def _git_oid(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
