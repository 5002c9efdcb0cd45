"""The Python SDK over cubic's REST API.

Plain ints and dicts in, plain dicts out. Calls that are safe to repeat (reads, lease,
heartbeat, report, release: the service makes them idempotent per worker or lease token) are
retried on connection errors and on answers that say "later" (429, 502, 503, 504), with
exponential backoff, full jitter and the server's ``Retry-After`` (:mod:`cubic.retry`), until
the outage budget (``outage_s``, 15 minutes by default) is spent: a restart of the API or of
its database is ridden through, not fatal. A 500 (a fault, not an outage) is retried a few
times only. Calls that create something (a study, enqueued configs, an import) are retried
only when the request never reached the server. Error answers become cubic's own
exceptions, with the server's message.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from cubic.errors import (
    Conflict,
    CubicError,
    Forbidden,
    InvalidInput,
    LeaseLost,
    NotFound,
    StorageError,
    Unauthorized,
)
from cubic.retry import DEFAULT_OUTAGE_S, Backoff, parse_retry_after

log = logging.getLogger("cubic.client")

_LATER = {429, 502, 503, 504}
"""Answers that mean "the service is briefly away": retried within the outage budget."""
_FAULT_RETRIES = 3
"""How often a 500 is retried: it may be transient, but it is not an outage."""


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
    except ValueError:
        body = {"detail": resp.text}
    detail = body.get("detail", body)
    if not isinstance(detail, str):
        detail = str(detail)
    kind = body.get("type", "")
    if resp.status_code == 401:
        raise Unauthorized(detail)
    if resp.status_code == 403:
        raise Forbidden(detail)
    if resp.status_code == 404:
        raise NotFound(detail)
    if resp.status_code == 409:
        raise (LeaseLost if kind == "LeaseLost" else Conflict)(detail)
    if resp.status_code in (400, 422):
        raise InvalidInput(detail, field=body.get("field"))
    if resp.status_code >= 500:
        raise StorageError(f"server error {resp.status_code}: {detail}")
    raise CubicError(f"HTTP {resp.status_code}: {detail}")


class CubicClient:
    """A client of one cubic service. Thread-safe (httpx.Client is).

    ``token`` (default: ``$CUBIC_TOKEN``) is sent as ``Authorization: Bearer``;
    ``on_response`` sees every answer (its headers, e.g. ``Server-Timing``) before it is read."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        outage_s: float = DEFAULT_OUTAGE_S,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.outage_s = outage_s
        self.backoff = backoff
        self.max_backoff = max_backoff
        token = token if token is not None else os.environ.get("CUBIC_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            transport=transport,
            headers=headers,
            event_hooks={"response": [on_response]} if on_response else None,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CubicClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # transport --------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, idempotent: bool, **kw: Any) -> Any:
        waits = Backoff(self.outage_s, self.backoff, self.max_backoff)
        faults = 0
        while True:
            retry_after: float | None = None
            try:
                resp = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                failure = f"cannot reach cubic at {self.url}: {exc}"
                if not (idempotent or never_sent):
                    raise StorageError(failure) from exc
                wait = waits.next_wait()
                if wait is None:
                    raise StorageError(f"{failure} (gave up after {self.outage_s:g} s)") from exc
            else:
                code = resp.status_code
                retry = idempotent and (code in _LATER or (code == 500 and faults < _FAULT_RETRIES))
                faults += code == 500
                if retry:
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    wait = waits.next_wait(retry_after)
                if not retry or wait is None:
                    _raise_for(resp)
                    return resp.json() if resp.content else None
                failure = f"HTTP {code}"
            if waits.attempt in (1, 10) or waits.attempt % 50 == 0:
                log.warning(
                    "%s %s: %s; retrying (attempt %d)", method, path, failure, waits.attempt
                )
            time.sleep(wait)

    def _get(self, path: str, **params: Any) -> Any:
        params = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", path, idempotent=True, params=params)

    # studies ----------------------------------------------------------------------------
    def create_study(self, spec: dict[str, Any] | str) -> dict[str, Any]:
        """Submit a study spec: a dict, or the text of a YAML file."""
        if isinstance(spec, str):
            return self._call(
                "POST",
                "/v1/studies",
                idempotent=False,
                content=spec,
                headers={"Content-Type": "application/yaml"},
            )
        return self._call("POST", "/v1/studies", idempotent=False, json=spec)

    def create_study_from_file(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Submit a study file; the workload and space files it names are read here, on the
        client, and sent inline (the service reads nothing from its own disk)."""
        from cubic.study import load_spec

        spec, base = load_spec(path)  # validated here: errors name the field before upload
        resolved = spec.resolve(base)
        inline = {"workload": resolved.spec.workload, "space": resolved.spec.space}
        return self.create_study(spec.model_copy(update=inline).model_dump(mode="json"))

    def list_studies(
        self, state: str | None = None, kind: str | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        return self._get("/v1/studies", state=state, kind=kind, limit=limit, offset=offset)

    def get_study(self, study_id: int) -> dict[str, Any]:
        return self._get(f"/v1/studies/{study_id}")

    def _action(self, study_id: int, action: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/studies/{study_id}:{action}", idempotent=True)

    def pause(self, study_id: int) -> dict[str, Any]:
        return self._action(study_id, "pause")

    def resume(self, study_id: int) -> dict[str, Any]:
        return self._action(study_id, "resume")

    def stop(self, study_id: int) -> dict[str, Any]:
        return self._action(study_id, "stop")

    def archive(self, study_id: int) -> dict[str, Any]:
        return self._action(study_id, "archive")

    def best(self, study_id: int) -> dict[str, Any]:
        return self._get(f"/v1/studies/{study_id}/best")

    def pareto(self, study_id: int) -> dict[str, Any]:
        """The study's Pareto front: ``{"objectives": [...], "points": [{"values", "trial",
        "predicted"}, ...], "n_measured"}``, best first by the first objective."""
        return self._get(f"/v1/studies/{study_id}/pareto")

    # trials -----------------------------------------------------------------------------
    def trials(
        self, study_id: int, state: str | None = None, limit: int = 500, offset: int = 0
    ) -> dict[str, Any]:
        return self._get(f"/v1/studies/{study_id}/trials", state=state, limit=limit, offset=offset)

    def all_trials(self, study_id: int, state: str | None = None) -> list[dict[str, Any]]:
        """Every trial of a study, following the pages."""
        out: list[dict[str, Any]] = []
        while True:
            page = self.trials(study_id, state=state, offset=len(out))
            out.extend(page["items"])
            if not page["items"] or len(out) >= page["total"]:
                return out

    def trial(self, trial_id: int) -> dict[str, Any]:
        return self._get(f"/v1/trials/{trial_id}")

    def lease(
        self, study_id: int, worker_id: str, count: int = 1, lease_seconds: float = 300.0
    ) -> list[dict[str, Any]]:
        return self.lease_batch(study_id, worker_id, count, lease_seconds)["trials"]

    def lease_batch(
        self, study_id: int, worker_id: str, count: int = 1, lease_seconds: float = 300.0
    ) -> dict[str, Any]:
        """The whole lease answer: ``trials``, ``study_state`` and ``retry_after_s`` (how
        long to wait before asking again when fewer trials than asked were waiting)."""
        body = {"worker_id": worker_id, "count": count, "lease_seconds": lease_seconds}
        return self._call(
            "POST", f"/v1/studies/{study_id}/trials:lease", idempotent=True, json=body
        )

    def heartbeat(
        self,
        trial_id: int,
        lease_token: str,
        lease_seconds: float = 300.0,
        progress: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Extend the lease; with the job's ``progress`` (see :class:`cubic.pruning.Progress`),
        the answer's ``prune`` is set when the study's pruner stops the trial."""
        body: dict[str, Any] = {"lease_token": lease_token, "lease_seconds": lease_seconds}
        if progress is not None:
            body["progress"] = progress
        return self._call("POST", f"/v1/trials/{trial_id}:heartbeat", idempotent=True, json=body)

    def report(
        self,
        trial_id: int,
        lease_token: str,
        state: str,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
        log_tail: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "lease_token": lease_token,
            "state": state,
            "metrics": metrics or {},
            "error": error,
            "log_tail": log_tail,
        }
        return self._call("POST", f"/v1/trials/{trial_id}:report", idempotent=True, json=body)

    def release(self, trial_id: int, lease_token: str) -> dict[str, Any]:
        return self._call(
            "POST",
            f"/v1/trials/{trial_id}:release",
            idempotent=True,
            json={"lease_token": lease_token},
        )

    def enqueue(self, study_id: int, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._call(
            "POST",
            f"/v1/studies/{study_id}/trials:enqueue",
            idempotent=False,
            json={"configs": configs},
        )

    def import_history(self, study_id: int, trials: list[dict[str, Any]]) -> Any:
        return self._call(
            "POST",
            f"/v1/studies/{study_id}/trials:import",
            idempotent=False,
            json={"trials": trials},
        )

    def healthz(self) -> dict[str, Any]:
        return self._get("/healthz")
