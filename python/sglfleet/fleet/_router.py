"""Take SGLang instances out of SGLang's router (`sglang-router` 0.3.2) and put them back: its `/workers` API.

Lines of sglang-router 0.3.2's source distribution (PyPI `sglang_router-0.3.2.tar.gz`, the tree under the
repository's `sgl-router/`), checked against the 0.3.2 wheel in tests/unit/fleet/test_router_workers.py:

- Routes: `src/server.rs:634-639` (`/workers` POST and GET, `/workers/{worker_id}` GET, PUT, DELETE), behind
  the router's `--api-key` like its generation routes (`server.rs:641-656`): the same key authorises the
  call and, in the POST body, is the key the router uses towards the worker.
- `GET /workers` -> 200 `{"workers": [{"id": "<uuid>", "url": ..., "is_healthy": ..., "load": ..., ...}],
  "total": N, "stats": {...}}` (`src/core/worker_service.rs:151-172`, `262-282`).
- `DELETE /workers/{worker_id}` with the UUID that list gives (`worker_service.rs:209-216`,
  `parse_worker_id`: a URL is 400 "Invalid worker_id ... (expected UUID)"; an unknown id 404
  `WORKER_NOT_FOUND`, `worker_service.rs:38-56`) -> 202 "Worker removal queued for background processing"
  (`worker_service.rs:111-127`, `314-336`): the removal is a job that takes the worker out of the policy
  first, then out of the registry (`src/core/steps/worker/local/mod.rs:210-273`), so once the list no longer
  holds the URL nothing new is routed there. Requests already sent to the worker finish there.
- `POST /workers` `{"url": ..., "api_key": ...}` -> 202 "Worker addition queued for background processing"
  (`worker_service.rs:225-259`, `87-109`): the job lists the worker only once it answers `/health`
  (`local/mod.rs:79-106`: retried for up to `--worker-startup-timeout-secs`, 1800 s by default, so a worker
  that comes up later is registered then), healthy at once (`src/core/steps/worker/shared/activate.rs:27-29`)
  and health-checked with the router's own flags (`local/create_worker.rs:273-283`). A worker added without
  `api_key` while the router has one gets no key (the router warns "Worker will be accessible without
  authentication", `worker_service.rs:229-236`), so the key always goes along.

A draining SGLang 0.5.12 accepts new requests while only `/health*` answer 503 (the SGLang stand-in's
`sigterm_handler` cites the lines), and the router notices a worker's 503s only after
`--health-failure-threshold` checks `--health-check-interval-secs` apart (`src/core/worker.rs:703-752`,
`src/core/worker_registry.rs:641-687`): so an instance leaves the router before it is stopped and comes back
once its health gate passed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RouterError", "RouterWorker", "RouterWorkers"]

DEFAULT_WAIT_S = 30.0


class RouterError(RuntimeError):
    """The router refused or could not be asked; the message names the router and what it said."""


@dataclass(frozen=True)
class RouterWorker:
    """One worker as the router lists it."""

    id: str
    url: str
    healthy: bool


def _norm(url: str) -> str:
    return url.strip().rstrip("/").lower()


@dataclass
class RouterWorkers:
    """The `/workers` API of one router. `clock` and `sleep` are injectable (tests)."""

    router_url: str
    api_key: str | None = None
    timeout_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.router_url.rstrip("/") + path
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        except (OSError, urllib.error.URLError) as err:
            raise RouterError(f"{method} {url}: the router did not answer ({err})") from err
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def list(self) -> list[RouterWorker]:
        status, body = self._call("GET", "/workers")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            raise RouterError(
                f"GET {self.router_url}/workers answered {status} {str(body)[:200]!r}: not sglang-router's "
                "worker list (sglang-router >= 0.3.2 serves it; with --api-key it needs the same key)"
            )
        return [
            RouterWorker(str(w.get("id", "")), str(w.get("url", "")), bool(w.get("is_healthy")))
            for w in body["workers"]
            if isinstance(w, dict)
        ]

    def _wait(self, done: Callable[[list[RouterWorker]], bool], wait_s: float) -> list[RouterWorker]:
        deadline = self.clock() + wait_s
        while True:
            workers = self.list()
            if done(workers) or self.clock() >= deadline:
                return workers
            self.sleep(0.2)

    def remove(self, worker_urls: Sequence[str], *, wait_s: float = DEFAULT_WAIT_S) -> list[str]:
        """Take these workers out (those registered); return the URLs removed, once the router lists
        none of them. Raises RouterError if the router refuses or still lists one after `wait_s`."""
        wanted = {_norm(u) for u in worker_urls}
        present = [w for w in self.list() if _norm(w.url) in wanted]
        for worker in present:
            status, body = self._call("DELETE", f"/workers/{urllib.parse.quote(worker.id, safe='')}")
            # 404: gone meanwhile (its removal is what we want)
            if status not in (200, 202, 404):
                raise RouterError(
                    f"DELETE {self.router_url}/workers/{worker.id} ({worker.url}) answered {status} "
                    f"{str(body)[:200]!r}"
                )
        left = [w.url for w in self._wait(lambda ws: not any(_norm(w.url) in wanted for w in ws), wait_s)]
        still = [u for u in left if _norm(u) in wanted]
        if still:
            raise RouterError(f"{self.router_url} still lists {', '.join(still)} {wait_s:g} s after DELETE")
        return [w.url for w in present]

    def add(self, worker_urls: Sequence[str], *, wait_s: float = DEFAULT_WAIT_S) -> list[str]:
        """Register these workers (those not registered yet); return the URLs added, once the router lists
        each of them healthy. Raises RouterError if it refuses or one is not listed healthy after `wait_s`
        (the router registers only a worker that answers its health check: see the journal of both)."""
        listed = {_norm(w.url) for w in self.list()}
        missing = [u.strip().rstrip("/") for u in worker_urls if _norm(u) not in listed]
        for url in missing:
            body: dict[str, Any] = {"url": url}
            if self.api_key:
                body["api_key"] = self.api_key
            status, answer = self._call("POST", "/workers", body)
            if status not in (200, 202):
                raise RouterError(
                    f"POST {self.router_url}/workers {url} answered {status} {str(answer)[:200]!r}"
                )
        wanted = {_norm(u) for u in worker_urls}

        def all_healthy(ws: list[RouterWorker]) -> bool:
            healthy = {_norm(w.url) for w in ws if w.healthy}
            return wanted <= healthy

        workers = self._wait(all_healthy, wait_s)
        if not all_healthy(workers):
            healthy = {_norm(w.url) for w in workers if w.healthy}
            absent = [u for u in worker_urls if _norm(u) not in healthy]
            raise RouterError(
                f"{self.router_url} does not list {', '.join(absent)} as a healthy worker {wait_s:g} s after "
                "POST /workers: the router registers a worker only once it answers its health check"
            )
        return missing
