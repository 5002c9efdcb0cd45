"""The ``kubernetes`` runner: each trial's job is a ``batch/v1`` Job in one namespace.

The Job comes from a Jinja2 template of its YAML manifest (the built-in
``templates/k8s-job.yaml.j2`` or the user's own), rendered per trial and checked before it is
sent: it must be a ``batch/v1`` Job whose containers have an image. Kubernetes does not
retry (``backoffLimit: 0``): cubic retries failed trials itself, so that a config that runs
out of memory is reported once as ``infeasible`` instead of being run again. The job shares no
files with the worker: it gets its config from ``CUBIC_CONFIG_JSON`` (the container's command
writes it to ``CUBIC_CONFIG`` first) and its metrics come back as the ``CUBIC_METRICS`` line of
the pod's log.

How a Job ends becomes an outcome through :func:`~cubic.runners.contract.classify`: a
container ``OOMKilled`` is infeasible; an evicted or preempted pod, the Job's deadline, or a
pod stuck pulling its image is failed (retried); otherwise the exit code and the log decide.
The runner calls the API at most once per ``poll_interval_s`` per trial.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from cubic.errors import CubicError, InvalidInput
from cubic.outcome import Outcome
from cubic.runners.base import Runner, TrialJob
from cubic.runners.contract import classify, parse_metrics, prepare, remote_command

log = logging.getLogger("cubic.runners.kubernetes")

BUILTIN_TEMPLATE = Path(__file__).with_name("templates") / "k8s-job.yaml.j2"
MAIN_CONTAINER = "trial"  # the container whose exit and log decide; else the first one
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # 1.27+, then the legacy one
# A container waiting for one of these reasons will not start by itself.
STUCK_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# A pod that ended for one of these reasons lost its node or its place, not its config.
LOST_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown"})
TRANSIENT_STATUS = frozenset({0, 408, 429, 500, 502, 503, 504})
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

_ENV = jinja2.sandbox.SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
)


class KubernetesError(CubicError):
    """The Kubernetes API refused or failed a call; ``status`` and ``reason`` say how."""

    status_code = 502

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.reason = reason


def api_error(action: str, exc: ApiException) -> KubernetesError:
    """An ApiException as a message a user can act on: what failed, HTTP status, reason."""
    message = ""
    try:
        body = json.loads(exc.body) if exc.body else {}
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    except (TypeError, ValueError):
        message = str(exc.body or "")[:500]
    text = f"Kubernetes API: {action} failed: HTTP {exc.status} {exc.reason}"
    return KubernetesError(
        f"{text}: {message}" if message else text, status=exc.status, reason=exc.reason
    )


def transient(exc: BaseException) -> bool:
    """A failure worth retrying at the next poll: the network, a timeout, an overloaded API."""
    if isinstance(exc, ApiException):
        return (exc.status or 0) in TRANSIENT_STATUS
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


# ---------------------------------------------------------------------------------------------
# The manifest: a pure function of the trial and the runner's options.


@dataclass(frozen=True, slots=True)
class ManifestOptions:
    """What the runner's options contribute to a Job manifest."""

    image: str | None = None
    namespace: str = "default"
    template: str | Path | None = None  # a Jinja2 template of the YAML; None: the built-in one
    service_account: str | None = None
    image_pull_policy: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    ttl_after_finished_s: int = 3600
    remote_dir: str = "/tmp/cubic"
    gpu_resource: str = "nvidia.com/gpu"

    @property
    def source(self) -> str:
        return str(self.template) if self.template else "the built-in Job template"


def job_name(job: TrialJob) -> str:
    """A DNS-1123 name (lower case, at most 63 characters) unique per trial attempt."""
    return f"cubic-s{job.study_id}-t{job.trial_id}-a{job.attempt}-{secrets.token_hex(2)}"


def cubic_labels(job: TrialJob) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "cubic",
        "cubic/study": str(job.study_id),
        "cubic/trial": str(job.trial_id),
        "cubic/attempt": str(job.attempt),
    }


def _workload_gpus(workload: dict[str, Any]) -> int:
    """GPUs of one node of the workload's cluster (a Job's pod runs on one node)."""
    cluster = workload.get("cluster") if isinstance(workload, dict) else None
    if not isinstance(cluster, dict):
        return 0
    per_node, total = cluster.get("gpus_per_node"), cluster.get("num_gpus")
    if per_node is None:
        return 0
    return int(min(per_node, total)) if total is not None else int(per_node)


def _quantity(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | str) or value == "":
        raise InvalidInput(f"{name}: expected a number or a Kubernetes quantity", field=name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def job_resources(job: TrialJob, gpu_resource: str = "nvidia.com/gpu") -> tuple[int, dict]:
    """GPUs and the container's ``resources``, from ``job.resources`` or the workload.

    ``job.resources`` may set ``gpus_per_node`` (0 for a CPU-only job), ``cpus`` (or
    ``cpus_per_task``) and ``memory`` (a quantity such as ``64Gi``; or ``memory_gb``). CPU
    goes to requests only, so that the job is never throttled; memory and GPUs are limits.
    """
    res = job.job.get("resources") or {}
    gpus = res.get("gpus_per_node", res.get("gpus"))
    if gpus is None:
        gpus = _workload_gpus(job.workload)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidInput(
            f"job.resources.gpus_per_node: expected a whole number >= 0, got {gpus!r}",
            field="job.resources.gpus_per_node",
        )
    cpus = res.get("cpus", res.get("cpus_per_task"))
    memory = res.get("memory")
    if memory is None and res.get("memory_gb") is not None:
        memory = f"{_quantity(res['memory_gb'], 'job.resources.memory_gb')}Gi"
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if gpus:
        limits[gpu_resource] = str(gpus)
    if memory is not None:
        limits["memory"] = requests["memory"] = _quantity(memory, "job.resources.memory")
    if cpus is not None:
        requests["cpu"] = _quantity(cpus, "job.resources.cpus")
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    return gpus, resources


def read_template(options: ManifestOptions) -> str:
    path = Path(options.template).expanduser() if options.template else BUILTIN_TEMPLATE
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"template {path}: cannot read it: {exc}", field="template") from exc
    try:
        _ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidInput(
            f"template {path}: not a valid Jinja2 template: {exc.message} (line {exc.lineno})",
            field="template",
        ) from exc
    return text


def template_variables(job: TrialJob, options: ManifestOptions, name: str) -> dict[str, Any]:
    """What a Job template sees; the built-in one uses most of it.

    ``name``, ``namespace``, ``labels`` (cubic's and the runner's), ``image``,
    ``image_pull_policy``, ``service_account``, ``node_selector``, ``tolerations``,
    ``active_deadline_s`` (the trial timeout), ``ttl_after_finished_s``, ``command`` (argv:
    ``/bin/sh -c script``), ``script``, ``env`` (a mapping) and ``env_list`` (``[{name,
    value}]``), ``gpus``, ``resources`` (the container's), ``workdir``, ``trial``, ``params``,
    ``workload``, ``job`` (the study's job section) and ``remote_dir``. Pass structured values
    through ``tojson``: JSON is YAML, and quoting stays right whatever a value holds.
    """
    prepared = prepare(job, None, remote_dir=options.remote_dir)
    gpus, resources = job_resources(job, options.gpu_resource)
    script = remote_command(prepared)
    return {
        "name": name,
        "namespace": options.namespace,
        "image": options.image,
        "image_pull_policy": options.image_pull_policy,
        "service_account": options.service_account,
        "labels": {**options.labels, **cubic_labels(job)},
        "node_selector": options.node_selector,
        "tolerations": options.tolerations,
        "active_deadline_s": max(1, math.ceil(job.timeout_s)),
        "ttl_after_finished_s": int(options.ttl_after_finished_s),
        "script": script,
        "command": ["/bin/sh", "-c", script],
        "env": prepared.env,
        "env_list": [{"name": k, "value": v} for k, v in prepared.env.items()],
        "gpus": gpus,
        "resources": resources,
        "workdir": job.job.get("workdir"),
        "trial": {
            "id": job.trial_id,
            "study_id": job.study_id,
            "number": job.number,
            "attempt": job.attempt,
        },
        "params": job.params,
        "workload": job.workload,
        "job": job.job,
        "remote_dir": options.remote_dir,
    }


def _containers(manifest: dict[str, Any]) -> list[Any]:
    spec = manifest.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod = template.get("spec") if isinstance(template, dict) else None
    containers = pod.get("containers") if isinstance(pod, dict) else None
    return containers if isinstance(containers, list) else []


def _stringify_quantities(container: dict[str, Any]) -> None:
    """``nvidia.com/gpu: 1`` as ``"1"``: the API takes both, the typed client only strings."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return
    for part in ("limits", "requests"):
        values = resources.get(part)
        if isinstance(values, dict):
            for key, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    values[key] = str(value)


def render_manifest(
    job: TrialJob, options: ManifestOptions | None = None, *, name: str | None = None
) -> dict[str, Any]:
    """The Job manifest (a dict) the runner would create for ``job``.

    Pure apart from reading the template file; use it to debug a template. Raises
    :class:`InvalidInput` naming the template when it does not render, is not YAML, is not a
    ``batch/v1`` Job, or leaves a container without an image.
    """
    options = options or ManifestOptions()
    source = options.source
    name = name or job_name(job)
    text = read_template(options)
    try:
        rendered = _ENV.from_string(text).render(**template_variables(job, options, name))
    except jinja2.TemplateError as exc:
        raise InvalidInput(f"template {source}: cannot render it: {exc}", field="template") from exc
    try:
        manifest = yaml.safe_load(rendered)
    except yaml.YAMLError as exc:
        raise InvalidInput(
            f"template {source}: the rendered manifest is not YAML: {exc}", field="template"
        ) from exc
    if not isinstance(manifest, dict):
        raise InvalidInput(f"template {source}: expected a YAML mapping", field="template")
    kind = f"{manifest.get('apiVersion')}/{manifest.get('kind')}"
    if kind != "batch/v1/Job":
        raise InvalidInput(
            f"template {source}: expected a batch/v1 Job, got apiVersion "
            f"{manifest.get('apiVersion')!r} kind {manifest.get('kind')!r}",
            field="template",
        )
    containers = _containers(manifest)
    if not containers or not all(isinstance(c, dict) for c in containers):
        raise InvalidInput(
            f"template {source}: the Job has no spec.template.spec.containers", field="template"
        )
    for c in containers:
        image = c.get("image")
        if not isinstance(image, str) or not image.strip() or image in ("None", "null"):
            raise InvalidInput(
                f"container {c.get('name')!r} has no image: set the kubernetes runner's `image` "
                f"option (or an image in {source})",
                field="image",
            )
        _stringify_quantities(c)
    meta = manifest.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise InvalidInput(f"template {source}: metadata must be a mapping", field="template")
    if "generateName" not in meta:
        meta.setdefault("name", name)
    if meta.setdefault("namespace", options.namespace) != options.namespace:
        raise InvalidInput(
            f"template {source}: sets namespace {meta['namespace']!r}, but the runner creates "
            f"Jobs in {options.namespace!r}",
            field="namespace",
        )
    ours = cubic_labels(job)
    meta["labels"] = {**(meta.get("labels") or {}), **ours}
    pod_meta = manifest["spec"]["template"].setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **ours}
    return manifest


def job_body(manifest: dict[str, Any], source: str) -> Any:
    """What ``create_namespaced_job`` gets: a typed ``V1Job`` where the client has typed
    (pydantic) models, which refuse a field in the wrong place; the dict itself otherwise."""
    validate = getattr(k8s.V1Job, "model_validate", None)
    if validate is None:
        return manifest
    import pydantic

    try:
        return validate(manifest)
    except pydantic.ValidationError as exc:
        raise InvalidInput(
            f"template {source}: the rendered manifest is not a valid Job: {exc}",
            field="template",
        ) from exc


# ---------------------------------------------------------------------------------------------
# The runner.


@dataclass(slots=True)
class KubernetesHandle:
    job: TrialJob
    name: str
    namespace: str
    container: str
    deadline: float  # monotonic: the Job's own deadline plus slack
    next_poll: float = 0.0
    pod_label: str | None = None  # which job-name label this cluster sets
    stuck_since: float | None = None
    cancelled: bool = False
    deleted: bool = False
    outcome: Outcome | None = None


def _condition(status: Any) -> Any:
    """The Job's terminal condition (``Complete`` or ``Failed``, status True), if any."""
    for c in (status.conditions if status is not None else None) or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return c
    return None


def _main_status(pod: Any, container: str) -> Any:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    for s in statuses:
        if s.name == container:
            return s
    return statuses[0] if statuses else None


def _terminated(pod: Any, container: str) -> Any:
    status = _main_status(pod, container)
    return status.state.terminated if status is not None and status.state else None


def _disruption(pod: Any) -> str | None:
    """Why a pod lost its node or place (eviction, preemption, node shutdown), if it did."""
    st = pod.status
    if st is None:
        return None
    if st.reason in LOST_REASONS:
        return f"{st.reason}: {st.message}" if st.message else st.reason
    for c in st.conditions or []:
        if c.type == "DisruptionTarget" and c.status == "True":
            return f"{c.reason}: {c.message}" if c.message else str(c.reason)
    return None


def _stuck(pod: Any) -> str | None:
    """A container of a pod that waits for a reason it will not recover from by itself."""
    st = pod.status
    if st is None or st.phase not in (None, "Pending"):
        return None
    for s in (st.init_container_statuses or []) + (st.container_statuses or []):
        waiting = s.state.waiting if s.state else None
        if waiting is not None and waiting.reason in STUCK_REASONS:
            why = f": {waiting.message}" if waiting.message else ""
            return f"pod {pod.metadata.name}: container {s.name} is {waiting.reason}{why}"
    return None


def _created(pod: Any) -> tuple[float, str]:
    ts = pod.metadata.creation_timestamp
    return (ts.timestamp() if ts is not None else 0.0, pod.metadata.name or "")


class KubernetesRunner(Runner):
    """Runs each trial as a Kubernetes Job through the official Python client."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "default",
        template: str | None = None,
        image: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        service_account: str | None = None,
        image_pull_policy: str | None = None,
        labels: dict[str, str] | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        poll_interval_s: float = 5.0,
        delete_finished: bool = True,
        ttl_after_finished_s: int = 3600,
        pending_grace_s: float = 300.0,
        deadline_slack_s: float = 60.0,
        log_tail_lines: int = 2000,
        request_timeout_s: float = 30.0,
        remote_dir: str = "/tmp/cubic",
        gpu_resource: str = "nvidia.com/gpu",
        api_client: k8s.ApiClient | None = None,
    ) -> None:
        if not _DNS_LABEL.match(namespace or "") or len(namespace) > 63:
            raise InvalidInput(
                f"namespace: not a valid namespace: {namespace!r}", field="namespace"
            )
        if template is None and not image:
            raise InvalidInput(
                "the kubernetes runner needs `image` (the container image of the trial's job), "
                "or a `template` that sets one",
                field="image",
            )
        if image_pull_policy is not None and image_pull_policy not in PULL_POLICIES:
            raise InvalidInput(
                f"image_pull_policy: expected one of {PULL_POLICIES}, got {image_pull_policy!r}",
                field="image_pull_policy",
            )
        for key, value, kind in (
            ("labels", labels, dict),
            ("node_selector", node_selector, dict),
            ("tolerations", tolerations, list),
        ):
            if value is not None and not isinstance(value, kind):
                raise InvalidInput(f"{key}: expected a {kind.__name__}", field=key)
        if tolerations and not all(isinstance(t, dict) for t in tolerations):
            raise InvalidInput("tolerations: expected a list of mappings", field="tolerations")
        if poll_interval_s < 0 or pending_grace_s < 0 or deadline_slack_s < 0:
            raise InvalidInput("poll_interval_s, pending_grace_s and deadline_slack_s must be >= 0")
        self.options = ManifestOptions(
            image=image,
            namespace=namespace,
            template=template,
            service_account=service_account,
            image_pull_policy=image_pull_policy,
            labels={str(k): str(v) for k, v in (labels or {}).items()},
            node_selector={str(k): str(v) for k, v in (node_selector or {}).items()},
            tolerations=list(tolerations or []),
            ttl_after_finished_s=int(ttl_after_finished_s),
            remote_dir=remote_dir,
            gpu_resource=gpu_resource,
        )
        read_template(self.options)  # a missing or broken template fails now, not per trial
        self.namespace = namespace
        self.poll_interval_s = poll_interval_s
        self.delete_finished = delete_finished
        self.pending_grace_s = pending_grace_s
        self.deadline_slack_s = deadline_slack_s
        self.log_tail_lines = log_tail_lines
        self.request_timeout_s = request_timeout_s
        self._owns_client = api_client is None
        self.api_client = api_client or connect(kubeconfig, context, in_cluster)
        self.batch = k8s.BatchV1Api(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)

    # -- checks and manifests -----------------------------------------------------------------

    def manifest(self, job: TrialJob, name: str | None = None) -> dict[str, Any]:
        """The Job manifest for ``job`` with this runner's options."""
        return render_manifest(job, self.options, name=name)

    def check(self, spec: dict[str, Any]) -> None:
        """Refuse a study whose Job cannot be made, before any trial is leased.

        Renders the template for a sample trial (no knobs, command ``true``); a template that
        names a knob cannot be checked this way and is checked per trial instead.
        """
        super().check(spec)
        sample = TrialJob.sample(spec, command="true", env={})
        try:
            job_body(self.manifest(sample), self.options.source)
        except InvalidInput as exc:
            if not isinstance(exc.__cause__, jinja2.UndefinedError):
                raise

    # -- the lifecycle ------------------------------------------------------------------------

    def submit(self, job: TrialJob) -> KubernetesHandle:
        manifest = self.manifest(job)
        body = job_body(manifest, self.options.source)
        try:
            created = self.batch.create_namespaced_job(
                self.namespace,
                body,
                field_validation="Strict",  # a field in the wrong place is an error, not dropped
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            raise api_error(f"create Job in namespace {self.namespace!r}", exc) from exc
        names = [c.get("name") for c in _containers(manifest)]
        now = time.monotonic()
        return KubernetesHandle(
            job=job,
            name=created.metadata.name,
            namespace=self.namespace,
            container=MAIN_CONTAINER if MAIN_CONTAINER in names else str(names[0]),
            deadline=now + job.timeout_s + self.deadline_slack_s,
            next_poll=now + self.poll_interval_s,
        )

    def poll(self, handle: KubernetesHandle) -> Outcome | None:
        h = handle
        if h.outcome is not None:
            return h.outcome
        if h.cancelled:
            h.outcome = classify(None, "", None, cancelled=True)
            return h.outcome
        now = time.monotonic()
        if now < h.next_poll:
            return None
        h.next_poll = now + self.poll_interval_s
        try:
            outcome = self._poll(h, now)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            if not transient(exc):
                assert isinstance(exc, ApiException)
                raise api_error(f"watch Job {h.name!r}", exc) from exc
            log.warning("job %s: Kubernetes API unreachable (%s); retrying", h.name, exc)
            if now < h.deadline:
                return None
            outcome = classify(None, "", None, timed_out=True, timeout_s=h.job.timeout_s)
        if outcome is not None:
            h.outcome = outcome
            if self.delete_finished:
                self._delete_quietly(h)
        return outcome

    def _poll(self, h: KubernetesHandle, now: float) -> Outcome | None:
        try:
            job = self.batch.read_namespaced_job(
                h.name, h.namespace, _request_timeout=self.request_timeout_s
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            h.deleted = True
            return classify(None, "", None, lost=f"Job {h.name} was deleted outside cubic")
        cond = _condition(job.status)
        if cond is not None:
            return self._conclude(h, cond)
        if now >= h.deadline:  # the cluster did not enforce activeDeadlineSeconds in time
            pods = self._pods(h)
            self._delete_quietly(h)
            log_text = self._log(h, pods[-1]) if pods else ""
            return classify(None, log_text, None, timed_out=True, timeout_s=h.job.timeout_s)
        if not (job.status and job.status.ready):
            return self._check_pending(h, now)
        h.stuck_since = None
        return None

    def _check_pending(self, h: KubernetesHandle, now: float) -> Outcome | None:
        """Fail a trial whose pod cannot start (bad image, missing secret) after a grace."""
        why = next((w for w in map(_stuck, self._pods(h)) if w), None)
        if why is None:
            h.stuck_since = None
            return None
        if h.stuck_since is None:
            h.stuck_since = now
        if now - h.stuck_since < self.pending_grace_s:
            return None
        self._delete_quietly(h)
        return classify(None, "", None, lost=f"{why} (for {now - h.stuck_since:.0f} s)")

    def _conclude(self, h: KubernetesHandle, cond: Any) -> Outcome:
        """The outcome of a Job that has ended, from its condition, pods and log."""
        pods = self._pods(h)
        objectives = h.job.objectives
        if cond.type == "Failed" and cond.reason == "DeadlineExceeded":
            log_text = self._log(h, pods[-1]) if pods else ""
            return classify(None, log_text, None, timed_out=True, timeout_s=h.job.timeout_s)
        if cond.type == "Complete":
            ok = [p for p in pods if p.status and p.status.phase == "Succeeded"] or pods
            pod = self._leader(ok)
            log_text = self._log(h, pod) if pod is not None else ""
            return classify(0, log_text, parse_metrics(log_text), objectives=objectives)
        for pod in reversed(pods):
            lost = _disruption(pod)
            if lost is not None:
                log_text = self._log(h, pod)
                return classify(None, log_text, None, lost=f"pod {pod.metadata.name}: {lost}")
        ended = [(p, _terminated(p, h.container)) for p in reversed(pods)]
        failed = [(p, t) for p, t in ended if t is not None and t.exit_code != 0]
        failed.sort(key=lambda pt: pt[1].reason != "OOMKilled")  # an OOM kill explains most
        if failed:
            pod, term = failed[0]
            log_text = self._log(h, pod)
            return classify(
                term.exit_code,
                log_text,
                parse_metrics(log_text),
                objectives=objectives,
                oom_killed=term.reason == "OOMKilled",
            )
        return classify(
            None,
            "",
            None,
            lost=f"Job {h.name} failed ({cond.reason}: {cond.message}) and none of its pods "
            "says why",
        )

    @staticmethod
    def _leader(pods: list[Any]) -> Any:
        """The pod that prints the metrics: completion index 0 of an Indexed Job, else the
        newest."""
        for pod in pods:
            notes = pod.metadata.annotations or {}
            if notes.get("batch.kubernetes.io/job-completion-index") == "0":
                return pod
        return pods[-1] if pods else None

    def _pods(self, h: KubernetesHandle) -> list[Any]:
        """The Job's pods, oldest first."""
        for key in (h.pod_label,) if h.pod_label else JOB_NAME_LABELS:
            items = self.core.list_namespaced_pod(
                h.namespace,
                label_selector=f"{key}={h.name}",
                _request_timeout=self.request_timeout_s,
            ).items
            if items:
                h.pod_label = key
                return sorted(items, key=_created)
        return []

    def _log(self, h: KubernetesHandle, pod: Any) -> str:
        """The tail of the main container's log ('' when it is gone or never started)."""
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name,
                h.namespace,
                container=h.container,
                tail_lines=self.log_tail_lines,
                _request_timeout=self.request_timeout_s,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.info("job %s: no log from pod %s (%s)", h.name, pod.metadata.name, exc)
            return ""
        if isinstance(text, bytes):
            return text.decode("utf-8", errors="replace")
        return text if isinstance(text, str) else str(text or "")

    def _delete(self, h: KubernetesHandle) -> None:
        """Delete the Job and, in the background, its pods; a Job already gone is fine."""
        try:
            self.batch.delete_namespaced_job(
                h.name,
                h.namespace,
                propagation_policy="Background",
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise api_error(f"delete Job {h.name!r}", exc) from exc
        h.deleted = True

    def _delete_quietly(self, h: KubernetesHandle) -> None:
        if h.deleted:
            return
        try:
            self._delete(h)
        except (KubernetesError, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("job %s: could not delete it (its TTL will): %s", h.name, exc)

    def cancel(self, handle: KubernetesHandle) -> None:
        """Delete the Job with background propagation (idempotent: a Job gone is fine)."""
        h = handle
        if h.outcome is None:
            h.cancelled = True
        if not h.deleted:
            self._delete(h)

    def describe(self, handle: KubernetesHandle) -> dict[str, Any]:
        return {"job": handle.name, "namespace": handle.namespace}

    def close(self) -> None:
        if self._owns_client:
            self.api_client.close()


def connect(kubeconfig: str | None, context: str | None, in_cluster: bool) -> k8s.ApiClient:
    """An API client from a kubeconfig (``KUBECONFIG`` or ``~/.kube/config`` by default) or
    from the pod's service account when the worker itself runs in the cluster."""
    if in_cluster:
        if kubeconfig or context:
            raise InvalidInput(
                "in_cluster: cannot be combined with kubeconfig or context", field="in_cluster"
            )
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            raise InvalidInput(
                f"in_cluster: no in-cluster configuration: {exc}", field="in_cluster"
            ) from exc
        return k8s.ApiClient(configuration)
    try:
        return k8s_config.new_client_from_config(
            config_file=str(Path(kubeconfig).expanduser()) if kubeconfig else None,
            context=context,
        )
    except (k8s_config.ConfigException, OSError) as exc:
        where = kubeconfig or "the default kubeconfig"
        raise InvalidInput(f"kubeconfig: cannot load {where}: {exc}", field="kubeconfig") from exc
