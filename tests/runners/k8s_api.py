"""A scripted Kubernetes API server: the subset of the REST API the kubernetes runner uses.

Real HTTP on a local port (stdlib ``http.server`` in a thread) with the real API's paths and
JSON shapes, so that the official client's requests, serialisation and typed deserialisation
run for real: create, read and delete Jobs in a namespace, list pods by label selector, read a
pod's log. Every request is recorded. A test scripts what the "cluster" does with the next Job
it creates (:meth:`K8sApi.behave`): a list of :class:`Step` that apply after the Job has been
read a given number of times, which makes each scenario deterministic. :func:`executes` plays
the kubelet: it runs the container's command on this machine with the container's
environment, so that a whole trial (config in, metrics line out) goes through the fake cluster.

This is not a cluster: nothing is scheduled, no deadline or TTL is enforced, only what a
scenario says happens.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

JOBS = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs$")
JOB = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+?)(?:/status)?$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
POD_LOG = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$")


def stamp(offset_s: float = 0.0) -> str:
    return datetime.fromtimestamp(time.time() + offset_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """The API's error document (``v1.Status``)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class Step:
    """Something the cluster does once the Job has been read ``after_reads`` times.

    ``apply`` returning False means "not yet" (a process still running): it is tried again
    at the next read.
    """

    after_reads: int
    apply: Callable[[JobState], bool | None]


@dataclass
class JobState:
    """One Job as the fake cluster holds it: the object, its pods, their logs, its script."""

    job: dict[str, Any]
    steps: list[Step]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    reads: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def container(self) -> dict[str, Any]:
        return self.job["spec"]["template"]["spec"]["containers"][0]

    def newest(self) -> dict[str, Any]:
        return list(self.pods.values())[-1]

    def add_pod(self) -> bool | None:
        """The Job controller creates a pod from the template; it waits for its container."""
        meta = self.job["metadata"]
        template = self.job["spec"]["template"]
        name = f"{meta['name']}-{secrets.token_hex(3)[:5]}"
        self.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "uid": str(uuid.uuid4()),
                "resourceVersion": "1",
                "creationTimestamp": stamp(len(self.pods)),
                "labels": dict(template["metadata"]["labels"]),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": "gpu-node-1"},
            "status": {
                "phase": "Pending",
                "qosClass": "BestEffort",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp()}
                ],
                "containerStatuses": [
                    self._container_status(c, {"waiting": {"reason": "ContainerCreating"}})
                    for c in template["spec"]["containers"]
                ],
            },
        }
        self.logs[name] = ""
        status = self.job["status"]
        status.update(active=1, ready=0, startTime=status.get("startTime") or stamp())
        return None

    @staticmethod
    def _container_status(container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        running = "running" in state
        return {
            "name": container["name"],
            "image": container["image"],
            "imageID": "" if "waiting" in state else f"{container['image']}@sha256:" + "0" * 64,
            "ready": running,
            "started": running,
            "restartCount": 0,
            "state": state,
        }

    def _set_state(self, pod: dict[str, Any], state: dict[str, Any]) -> None:
        pod["status"]["containerStatuses"] = [
            self._container_status(c, state) for c in pod["spec"]["containers"]
        ]

    def wait(self, reason: str, message: str) -> bool | None:
        """The newest pod's containers wait for ``reason`` (an image that cannot be pulled)."""
        self._set_state(self.newest(), {"waiting": {"reason": reason, "message": message}})
        return None

    def run(self) -> bool | None:
        pod = self.newest()
        pod["status"].update(phase="Running", startTime=stamp(), podIP="10.0.0.7")
        self._set_state(pod, {"running": {"startedAt": stamp()}})
        self.job["status"].update(active=1, ready=1)
        return None

    def end(self, exit_code: int, log: str, reason: str | None = None) -> bool | None:
        """The newest pod's container exits; with ``backoffLimit: 0`` the Job ends with it."""
        pod = self.newest()
        reason = reason or ("Completed" if exit_code == 0 else "Error")
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        self._set_state(
            pod,
            {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "startedAt": stamp(-1),
                    "finishedAt": stamp(),
                    "containerID": "containerd://" + "a" * 64,
                }
            },
        )
        self.logs[pod["metadata"]["name"]] = log
        if exit_code == 0:
            self.job["status"]["succeeded"] = self.job["status"].get("succeeded", 0) + 1
            self.finish("Complete")
        else:
            self.job["status"]["failed"] = self.job["status"].get("failed", 0) + 1
            self.finish("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff")
        return None

    def evict(self, message: str) -> bool | None:
        """The kubelet evicts the newest pod (node pressure); the Job fails with it."""
        pod = self.newest()
        pod["status"].update(phase="Failed", reason="Evicted", message=message)
        pod["status"]["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": message,
                "lastTransitionTime": stamp(),
            }
        )
        self._set_state(pod, {"terminated": {"exitCode": 137, "reason": "Error"}})
        self.job["status"]["failed"] = self.job["status"].get("failed", 0) + 1
        self.finish("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff")
        return None

    def exceed_deadline(self) -> bool | None:
        """The Job controller kills a Job past activeDeadlineSeconds and deletes its pods."""
        self.pods.clear()
        self.finish("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
        return None

    def finish(self, kind: str, reason: str | None = None, message: str | None = None) -> None:
        first = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        conditions = [
            {
                "type": t,
                "status": "True",
                "lastProbeTime": stamp(),
                "lastTransitionTime": stamp(),
                **({"reason": reason} if reason else {}),
                **({"message": message} if message else {}),
            }
            for t in (first, kind)
        ]
        self.job["status"].update(active=0, ready=0, conditions=conditions)
        if kind == "Complete":
            self.job["status"]["completionTime"] = stamp()

    def kubelet(self, workdir: Path, private: str) -> bool | None:
        """Start the container's command here, with its environment; finish when it exits.

        Each pod has its own filesystem: ``private`` (an absolute path in the container, such
        as the runner's ``remote_dir``) becomes a folder of its own per pod under ``workdir``.
        """
        pod = self.newest()["metadata"]["name"]
        if not self.procs:
            self.run()
            c = self.container
            root = workdir / pod
            root.mkdir(parents=True)

            def local(text: str) -> str:
                return text.replace(private, str(root))

            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            env.update({e["name"]: local(e.get("value", "")) for e in c.get("env", [])})
            cwd = c.get("workingDir") or str(root)
            out = (workdir / f"{pod}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [local(a) for a in [*c.get("command", []), *c.get("args", [])]],
                    env=env,
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
            out.close()
            return False
        rc = self.procs[0].poll()
        if rc is None:
            return False
        return self.end(rc, (workdir / f"{pod}.log").read_text())


# Scenarios: what the cluster does with the next Job.


def completes(log: str, exit_code: int = 0, reason: str | None = None) -> list[Step]:
    """The pod is created, runs, and its container exits with ``exit_code``."""
    return [
        Step(0, JobState.add_pod),
        Step(1, JobState.run),
        Step(2, lambda s: s.end(exit_code, log, reason)),
    ]


def oom_killed(log: str = "step 1\n") -> list[Step]:
    return completes(log, 137, "OOMKilled")


def evicted(message: str = "The node was low on resource: memory.") -> list[Step]:
    return [Step(0, JobState.add_pod), Step(1, JobState.run), Step(2, lambda s: s.evict(message))]


def deadline_exceeded() -> list[Step]:
    return [Step(0, JobState.add_pod), Step(1, JobState.run), Step(2, JobState.exceed_deadline)]


def image_pull_backoff() -> list[Step]:
    def pull(reason: str) -> Callable[[JobState], bool | None]:
        def apply(s: JobState) -> bool | None:
            image = s.container["image"]
            return s.wait(reason, f'Back-off pulling image "{image}": not found')

        return apply

    return [
        Step(0, JobState.add_pod),
        Step(1, pull("ErrImagePull")),
        Step(2, pull("ImagePullBackOff")),
    ]


def runs_forever() -> list[Step]:
    return [Step(0, JobState.add_pod), Step(1, JobState.run)]


def executes(workdir: Path, private: str = "/tmp/cubic") -> list[Step]:
    """Play the kubelet: run the container's command on this machine, ``private`` (the
    runner's ``remote_dir``) mapped to a folder per pod under ``workdir``."""
    return [Step(0, JobState.add_pod), Step(1, lambda s: s.kubelet(workdir, private))]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    code: int
    reason: str
    message: str
    times: int


class K8sApi:
    """The server and its state; use :func:`serve` to run it."""

    def __init__(self, validate_versions: tuple[str, ...] = ()) -> None:
        self.validate_versions = validate_versions
        self.jobs: dict[tuple[str, str], JobState] = {}
        self.requests: list[Recorded] = []
        self.scenarios: list[list[Step]] = []
        self.faults: list[Fault] = []
        self.lock = threading.RLock()
        self.url = ""

    # -- scripting ------------------------------------------------------------------------

    def behave(self, *scenarios: list[Step]) -> None:
        """What the next Jobs created do, in order (a Job beyond them stays pending)."""
        with self.lock:
            self.scenarios.extend(scenarios)

    def fail(
        self, method: str, path: str, code: int, reason: str, message: str, times: int = 1
    ) -> None:
        """Answer the next ``times`` matching requests with an error ``v1.Status``."""
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), code, reason, message, times))

    def forget(self, namespace: str, name: str) -> None:
        """Someone else deleted the Job."""
        with self.lock:
            self.jobs.pop((namespace, name), None)

    def sent(self, method: str, pattern: str = "") -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    def job(self, name: str, namespace: str = "default") -> JobState:
        return self.jobs[(namespace, name)]

    def close(self) -> None:
        for state in self.jobs.values():
            for proc in state.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    # -- the API ----------------------------------------------------------------------------

    def handle(self, method: str, target: str, body: Any) -> tuple[int, Any, str]:
        """Answer one request: (HTTP status, document or text, content type)."""
        url = urlsplit(target)
        query = parse_qs(url.query)
        with self.lock:
            self.requests.append(Recorded(method, url.path, query, body))
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and fault.path.search(url.path):
                    fault.times -= 1
                    return fault.code, status_body(fault.code, fault.reason, fault.message), ""
            if (m := JOBS.match(url.path)) and method == "POST":
                return self._create(m["ns"], query, body)
            if m := JOB.match(url.path):
                if method == "GET":
                    return self._read(m["ns"], m["name"])
                if method == "DELETE":
                    return self._delete(m["ns"], m["name"], query, body)
            if (m := PODS.match(url.path)) and method == "GET":
                return self._pods(m["ns"], (query.get("labelSelector") or [""])[0])
            if (m := POD_LOG.match(url.path)) and method == "GET":
                return self._log(m["ns"], m["name"], query)
        return 404, status_body(404, "NotFound", f"the server could not find {url.path}"), ""

    def _create(self, ns: str, query: dict[str, list[str]], doc: Any) -> tuple[int, Any, str]:
        if not isinstance(doc, dict) or doc.get("kind") != "Job":
            return 400, status_body(400, "BadRequest", "expected a Job"), ""
        errors = self._invalid(doc)
        if errors:
            name = doc.get("metadata", {}).get("name")
            msg = f'Job.batch "{name}" is invalid: {errors}'
            return 422, status_body(422, "Invalid", msg, name=name, kind="Job"), ""
        meta = doc.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = meta.get("generateName", "job-") + secrets.token_hex(3)[:5]
        if meta.get("namespace", ns) != ns:
            msg = "the namespace of the provided object does not match the namespace sent"
            return 400, status_body(400, "BadRequest", msg), ""
        name = meta["name"]
        if (ns, name) in self.jobs:
            msg = f'jobs.batch "{name}" already exists'
            return 409, status_body(409, "AlreadyExists", msg, name=name, kind="jobs"), ""
        uid = str(uuid.uuid4())
        meta.update(
            namespace=ns, uid=uid, resourceVersion="1", generation=1, creationTimestamp=stamp()
        )
        owned = {
            "batch.kubernetes.io/controller-uid": uid,
            "controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "job-name": name,
        }
        spec = doc["spec"]
        spec.setdefault("completions", 1)
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        template = spec["template"].setdefault("metadata", {})
        template["labels"] = {**(template.get("labels") or {}), **owned}
        doc["status"] = {}
        steps = self.scenarios.pop(0) if self.scenarios else []
        self.jobs[(ns, name)] = JobState(doc, list(steps))
        return 201, doc, ""

    def _invalid(self, doc: dict[str, Any]) -> str:
        """What the API server's validation would refuse (the published schemas, strict)."""
        if not self.validate_versions:
            return ""
        import kubernetes_validate

        for version in self.validate_versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                return f"{where}: {exc.message} (schema {version})"
        return ""

    def _read(self, ns: str, name: str) -> tuple[int, Any, str]:
        state = self.jobs.get((ns, name))
        if state is None:
            return 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'), ""
        while state.steps and state.steps[0].after_reads <= state.reads:
            if state.steps[0].apply(state) is False:
                break
            state.steps.pop(0)
        state.reads += 1
        return 200, state.job, ""

    def _delete(
        self, ns: str, name: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, str]:
        state = self.jobs.pop((ns, name), None)
        if state is None:
            return 404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'), ""
        for proc in state.procs:  # the pods go with it (background propagation)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        uid = state.job["metadata"]["uid"]
        return 200, status_body(200, "", "", name=name, group="batch", kind="jobs", uid=uid), ""

    def _pods(self, ns: str, selector: str) -> tuple[int, Any, str]:
        wanted = {}
        for term in filter(None, selector.split(",")):
            key, _, value = term.replace("==", "=").partition("=")
            wanted[key.strip()] = value.strip()
        items = [
            pod
            for (job_ns, _), state in self.jobs.items()
            if job_ns == ns
            for pod in state.pods.values()
            if all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}, ""

    def _log(self, ns: str, name: str, query: dict[str, list[str]]) -> tuple[int, Any, str]:
        for (job_ns, _), state in self.jobs.items():
            if job_ns == ns and name in state.pods:
                pod = state.pods[name]
                container = (query.get("container") or [""])[0]
                names = [c["name"] for c in pod["spec"]["containers"]]
                if container and container not in names:
                    msg = f"container {container} is not valid for pod {name}"
                    return 400, status_body(400, "BadRequest", msg), ""
                waiting = pod["status"]["containerStatuses"][0]["state"].get("waiting")
                if waiting:
                    msg = (
                        f'container "{names[0]}" in pod "{name}" is waiting to start: '
                        f"{waiting['reason']}"
                    )
                    return 400, status_body(400, "BadRequest", msg), ""
                text = state.logs.get(name, "")
                tail = (query.get("tailLines") or [""])[0]
                if tail:
                    text = "".join(text.splitlines(keepends=True)[-int(tail) :])
                return 200, text, "text/plain"
        return 404, status_body(404, "NotFound", f'pods "{name}" not found'), ""


def _handler(api: K8sApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, doc, content_type = api.handle(self.command, self.path, body)
            data = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type or "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@contextmanager
def serve(validate_versions: tuple[str, ...] = ()) -> Iterator[K8sApi]:
    """Run a :class:`K8sApi` on a free local port for the duration of the block."""
    api = K8sApi(validate_versions)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="k8s-api"
    )
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        api.close()
