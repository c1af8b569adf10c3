"""The lab's fake Hugging Face Hub: one small private model repo, on loopback, for `hf download`.

`hf download REPO --revision REV --local-dir DIR` (huggingface_hub 2.4.0, as role model_weights pins
it; 0.36.0 reads the same) talks to `constants.ENDPOINT = os.getenv("HF_ENDPOINT",
"https://huggingface.co")` (constants.py:69), read once at import, so HF_ENDPOINT in the environment
of `hf` is all a client needs. What it asks, and what is answered here:

- `GET {endpoint}/api/models/{repo_id}/revision/{revision}` (hf_api.py:3205, model_info): the repo's
  info, whose `sha` is the commit and `siblings[].rfilename` the files (0.36.0
  _snapshot_download.py:256-260);
- with a pinned commit as the revision, 2.4.0 skips the info call and lists the files with
  `GET {endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true` (_snapshot_download.py:266-297,
  hf_api.py list_repo_tree): entries `{type, path, size, oid}`, oid the git blob id;
- `HEAD` then `GET {endpoint}/{repo_id}/resolve/{revision}/{filename}` (constants.py:70,
  file_download.py:1677-1680, get_hf_file_metadata): headers `X-Repo-Commit` (the commit), `ETag`
  (the file's etag), `Content-Length`; no `X-Xet-Hash`, so the plain HTTP download is used.
- Errors carry `X-Error-Code` as the Hub's do (0.36.0 utils/_http.py:404-452): a missing
  or wrong token on this private repo is a 401 `RepoNotFound`, an unknown revision a 404
  `RevisionNotFound`, an unknown file a 404 `EntryNotFound`.

The repo's token is a published, lab-only value (inventory/lab has it too), worth nothing elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from aiohttp import web

HUB_PORT = 8017
REPO_ID = "sglfleet-lab/standin-7b"
# The repo's one commit (what a pinned revision names).
COMMIT = "5d1a7c0f3b2e4d6a8c9b0e1f2a3b4c5d6e7f8a9b"
HUB_TOKEN = "hf_sglfleetLabOnlyTokenThatIsPublished0001"

CONFIG = {
    "architectures": ["StandinForCausalLM"],
    "model_type": "standin",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
}


def _files() -> dict[str, bytes]:
    return {
        "config.json": (json.dumps(CONFIG, indent=2) + "\n").encode(),
        "tokenizer_config.json": b'{"model_max_length": 32768}\n',
        "generation_config.json": b'{"max_new_tokens": 128}\n',
        # Not weights anyone could use: a few bytes under the name the loaders look for.
        "model.safetensors": b'\x08\x00\x00\x00\x00\x00\x00\x00{"a":{}}',
        "README.md": b"# standin-7b\n\nThe sglfleet lab's fake model repo (served on loopback only).\n",
    }


def _blob_id(body: bytes) -> str:
    """A file's git blob id, which the Hub gives as oid and ETag of a file not in LFS."""
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


@dataclass
class FakeHub:
    """The fake Hub's state; `requests` logs (method, path, had a valid token) for tests."""

    repo_id: str = REPO_ID
    commit: str = COMMIT
    token: str = HUB_TOKEN
    files: dict[str, bytes] = field(default_factory=_files)
    requests: list[tuple[str, str, bool]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{revision}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{revision}", self._tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{filename:.+}", self._resolve)
        return app

    def _authorised(self, request: web.Request) -> bool:
        ok = request.headers.get("Authorization", "") == f"Bearer {self.token}"
        self.requests.append((request.method, request.path, ok))
        return ok

    def _check(self, request: web.Request) -> None:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo != self.repo_id or not self._authorised(request):
            raise web.HTTPUnauthorized(
                headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                text=json.dumps({"error": "Repository not found"}),
            )
        if request.match_info["revision"] not in (self.commit, "main"):
            raise web.HTTPNotFound(
                headers={"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"},
                text=json.dumps({"error": "Invalid rev id: " + request.match_info["revision"]}),
            )

    async def _info(self, request: web.Request) -> web.Response:
        self._check(request)
        return web.json_response(
            {
                "_id": "6600000000000000000000aa",
                "id": self.repo_id,
                "modelId": self.repo_id,
                "sha": self.commit,
                "private": True,
                "gated": False,
                "disabled": False,
                "tags": ["standin"],
                "siblings": [{"rfilename": name} for name in sorted(self.files)],
                "lastModified": "2026-01-01T00:00:00.000Z",
            }
        )

    async def _tree(self, request: web.Request) -> web.Response:
        self._check(request)
        entries = [
            {"type": "file", "path": name, "size": len(body), "oid": _blob_id(body)}
            for name, body in sorted(self.files.items())
        ]
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        self._check(request)
        body = self.files.get(request.match_info["filename"])
        if body is None:
            missing = {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}
            raise web.HTTPNotFound(headers=missing)
        headers = {
            "X-Repo-Commit": self.commit,
            "ETag": '"' + _blob_id(body) + '"',
            "Content-Length": str(len(body)),
            "Content-Type": "application/octet-stream",
        }
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=body, headers=headers)


async def start_hub(hub: FakeHub, host: str = "127.0.0.1", port: int = HUB_PORT) -> web.AppRunner:
    """Serve the hub (plain HTTP, loopback only) until the runner is cleaned up."""
    runner = web.AppRunner(hub.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
