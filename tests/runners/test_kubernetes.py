"""The kubernetes runner: its manifests against the published Kubernetes schemas, and the
official client's calls against a scripted API server (``k8s_api``) that speaks real HTTP and
the API's JSON. There is no cluster here: what a cluster does is scripted per test."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cubic.errors import InvalidInput
from cubic.runners.base import TrialJob
from tests.requirements import need
from tests.runners.outcomes import wait

try:
    import kubernetes_validate
    from kubernetes import client as k8s

    from cubic.runners.kubernetes import (
        KubernetesError,
        KubernetesRunner,
        ManifestOptions,
        job_body,
        job_name,
        render_manifest,
    )
    from tests.runners import k8s_api
    from tests.runners.k8s_api import K8sApi, serve

    MISSING = ""
    _versions = kubernetes_validate.utils.all_versions()
    LATEST = kubernetes_validate.utils.latest_version()
    OLDER = "1.29.0" if "1.29.0" in _versions else _versions[0]
    VERSIONS = (LATEST, OLDER)
except ImportError as exc:  # the runner's extra or the schemas are not installed
    MISSING = f"{exc.name} is not installed (pip install 'cubic[kubernetes]' kubernetes-validate)"
    VERSIONS = ("1.29.0",)

IMAGE = "ghcr.io/acme/train:2.4"
PY = shlex.quote(sys.executable)
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
METRICS_LOG = 'step 10 loss 2.1\nCUBIC_METRICS {"tokens_per_s": 4321.5, "mem_gb": 61.2}\n'


@pytest.fixture(autouse=True)
def _kubernetes_installed() -> None:
    need("kubernetes", not MISSING, MISSING)


def trial(
    *,
    gpus: int | None = None,
    resources: dict[str, Any] | None = None,
    timeout_s: float = 600,
    command: str = "python train.py {{ flags }}",
) -> TrialJob:
    job: dict[str, Any] = {
        "command": command,
        "env": {"NCCL_DEBUG": "WARN", "RUN_NAME": "mb{{ micro_batch }}"},
        "workdir": "/workspace",
    }
    if resources is not None:
        job["resources"] = resources
    workload = {"cluster": {"gpu": "h100_sxm", "num_gpus": 16, "gpus_per_node": gpus or 8}}
    return TrialJob(
        trial_id=345,
        study_id=12,
        number=7,
        attempt=2,
        params={"micro_batch": 4, "tp": 2, "bf16": True},
        workload=workload,
        timeout_s=timeout_s,
        job=job,
        objectives=("tokens_per_s",),
    )


def validate_everywhere(manifest: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    (c,) = manifest["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"]}


# ------------------------------------------------------------------ manifests and the schemas


@pytest.mark.parametrize("version", VERSIONS)
def test_the_builtin_job_with_gpus_validates_and_says_what_cubic_needs(version: str) -> None:
    job = trial()
    manifest = render_manifest(job, ManifestOptions(image=IMAGE, namespace="ml"))
    kubernetes_validate.validate(manifest, version, strict=True)
    assert manifest["apiVersion"] == "batch/v1" and manifest["kind"] == "Job"
    spec = manifest["spec"]
    assert spec["backoffLimit"] == 0  # cubic retries, not Kubernetes
    assert spec["activeDeadlineSeconds"] == 600
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    labels = {
        "app.kubernetes.io/managed-by": "cubic",
        "cubic/study": "12",
        "cubic/trial": "345",
        "cubic/attempt": "2",
    }
    assert manifest["metadata"]["labels"] == labels
    assert spec["template"]["metadata"]["labels"] == labels
    assert manifest["metadata"]["namespace"] == "ml"
    name = manifest["metadata"]["name"]
    assert DNS_1123.match(name) and len(name) <= 63 and name.startswith("cubic-s12-t345-a2-")
    c = container(manifest)
    assert c["image"] == IMAGE and c["workingDir"] == "/workspace"
    assert c["command"][:2] == ["/bin/sh", "-c"]
    assert c["command"][2].endswith("python train.py --micro-batch 4 --tp 2 --bf16")
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    env = env_of(c)
    doc = json.loads(env["CUBIC_CONFIG_JSON"])
    assert doc["params"] == {"micro_batch": 4, "tp": 2, "bf16": True}
    assert doc["trial"] == {"id": 345, "study_id": 12, "number": 7, "attempt": 2}
    assert env["CUBIC_CONFIG"] == "/tmp/cubic/config.json"
    assert env["CUBIC_PARAM_MICRO_BATCH"] == "4" and env["RUN_NAME"] == "mb4"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_cpu_only_job_takes_its_resources_from_the_study(version: str) -> None:
    job = trial(resources={"gpus_per_node": 0, "cpus": 4, "memory": "16Gi"})
    manifest = render_manifest(job, ManifestOptions(image=IMAGE, image_pull_policy="Always"))
    kubernetes_validate.validate(manifest, version, strict=True)
    c = container(manifest)
    assert c["resources"] == {
        "limits": {"memory": "16Gi"},
        "requests": {"cpu": "4", "memory": "16Gi"},
    }
    assert c["imagePullPolicy"] == "Always"
    # A small workload asks for its GPU count, not a whole node's; memory_gb is GiB.
    small = TrialJob.sample(
        {"workload": {"cluster": {"num_gpus": 2, "gpus_per_node": 8}}},
        command="true",
        resources={"memory_gb": 80},
    )
    res = container(
        render_manifest(small, ManifestOptions(image=IMAGE, gpu_resource="amd.com/gpu"))
    )
    assert res["resources"]["limits"] == {"amd.com/gpu": "2", "memory": "80Gi"}


def test_runner_options_reach_the_builtin_job() -> None:
    opts = ManifestOptions(
        image=IMAGE,
        service_account="trainer",
        labels={"team": "llm"},
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ttl_after_finished_s=120,
    )
    manifest = render_manifest(trial(), opts)
    validate_everywhere(manifest)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["nodeSelector"] == opts.node_selector and pod["tolerations"] == opts.tolerations
    assert manifest["metadata"]["labels"]["team"] == "llm"
    assert manifest["spec"]["ttlSecondsAfterFinished"] == 120


USER_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ name }}
  labels: {{ labels | tojson }}
spec:
  backoffLimit: 0
  activeDeadlineSeconds: {{ active_deadline_s }}
  template:
    spec:
      restartPolicy: Never
      serviceAccountName: llm-trainer
      priorityClassName: research
      nodeSelector:
        cloud.google.com/gke-accelerator: nvidia-h100-80gb
      tolerations:
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      volumes:
        - name: shm
          emptyDir: {medium: Memory, sizeLimit: 64Gi}
      containers:
        - name: trainer
          image: us-docker.pkg.dev/acme/train:{{ trial.study_id }}
          command: {{ command | tojson }}
          env: {{ env_list | tojson }}
          volumeMounts:
            - {name: shm, mountPath: /dev/shm}
          resources:
            limits: {nvidia.com/gpu: {{ gpus }}, memory: 200Gi}
"""


def test_a_user_template_sets_node_selector_tolerations_and_service_account(
    tmp_path: Path,
) -> None:
    path = tmp_path / "job.yaml.j2"
    path.write_text(USER_TEMPLATE)
    manifest = render_manifest(trial(), ManifestOptions(template=path))  # the image is its own
    validate_everywhere(manifest)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-trainer"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    c = container(manifest)
    assert c["image"] == "us-docker.pkg.dev/acme/train:12"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # a YAML number, sent as a string
    # The runner adds what it tracks the Job by, even where the template leaves it out.
    assert manifest["metadata"]["namespace"] == "default"
    assert manifest["spec"]["template"]["metadata"]["labels"]["cubic/trial"] == "345"
    assert "CUBIC_CONFIG_JSON" in env_of(c)
    job_body(manifest, str(path))  # and the typed client takes it


BROKEN_TEMPLATE = USER_TEMPLATE.replace(
    "          volumeMounts:", "          nodeSelector: {pool: gpu}\n          volumeMounts:"
)


def test_a_field_in_the_wrong_place_fails_the_schema_and_the_runner(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml.j2"
    path.write_text(BROKEN_TEMPLATE)
    manifest = render_manifest(trial(), ManifestOptions(template=path))
    for version in VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError, match="nodeSelector"):
            kubernetes_validate.validate(manifest, version, strict=True)
    if hasattr(k8s.V1Job, "model_validate"):  # a typed client refuses it before sending
        with pytest.raises(InvalidInput, match="nodeSelector") as err:
            job_body(manifest, str(path))
        assert err.value.field == "template" and str(path) in str(err.value)


def test_templates_that_cannot_make_a_job_are_refused_naming_the_template(tmp_path: Path) -> None:
    cases = {
        "undefined.j2": (USER_TEMPLATE.replace("{{ gpus }}", "{{ gpu_count }}"), "gpu_count"),
        "syntax.j2": ("kind: Job\nmetadata: {{ name ", "not a valid Jinja2 template"),
        "notyaml.j2": ("apiVersion: batch/v1\nkind: Job\nspec: [unclosed", "not YAML"),
        "deploy.j2": (
            USER_TEMPLATE.replace("batch/v1", "apps/v1").replace("kind: Job", "kind: Deployment"),
            "expected a batch/v1 Job",
        ),
        "nocontainers.j2": ("apiVersion: batch/v1\nkind: Job\nspec: {}\n", "no spec.template"),
    }
    for filename, (text, message) in cases.items():
        path = tmp_path / filename
        path.write_text(text)
        with pytest.raises(InvalidInput, match=re.escape(message)) as err:
            render_manifest(trial(), ManifestOptions(template=path))
        assert err.value.field == "template", filename
        assert str(path) in str(err.value), filename
    with pytest.raises(InvalidInput) as err:
        render_manifest(trial(), ManifestOptions(template=tmp_path / "absent.j2"))
    assert err.value.field == "template" and "absent.j2" in str(err.value)
    other_ns = USER_TEMPLATE.replace("metadata:\n  name:", "metadata:\n  namespace: prod\n  name:")
    (tmp_path / "ns.j2").write_text(other_ns)
    with pytest.raises(InvalidInput, match="prod") as err:
        render_manifest(trial(), ManifestOptions(template=tmp_path / "ns.j2"))
    assert err.value.field == "namespace"


def test_the_image_is_required_unless_the_template_sets_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="image") as err:
        KubernetesRunner(api_client=k8s.ApiClient(k8s.Configuration(host="http://x")))
    assert err.value.field == "image"
    with pytest.raises(InvalidInput, match="image") as err:
        render_manifest(trial(), ManifestOptions())
    assert err.value.field == "image"
    path = tmp_path / "t.j2"
    path.write_text(
        USER_TEMPLATE.replace("us-docker.pkg.dev/acme/train:{{ trial.study_id }}", "{{ image }}")
    )
    with pytest.raises(InvalidInput, match="no image") as err:
        render_manifest(trial(), ManifestOptions(template=path))
    assert err.value.field == "image"
    assert container(render_manifest(trial(), ManifestOptions(template=path, image=IMAGE)))


def test_job_names_are_dns_labels_and_unique_per_submit() -> None:
    big = TrialJob(trial_id=2**63 - 1, study_id=2**63 - 1, number=0, attempt=99, params={})
    names = {job_name(big) for _ in range(50)}
    assert len(names) > 40
    assert all(DNS_1123.match(n) and len(n) <= 63 for n in names)


def test_bad_options_are_refused_naming_the_option() -> None:
    client = k8s.ApiClient(k8s.Configuration(host="http://x"))
    for options, name in (
        ({"namespace": "ML_Team"}, "namespace"),
        ({"image_pull_policy": "Sometimes"}, "image_pull_policy"),
        ({"tolerations": {"key": "x"}}, "tolerations"),
        ({"node_selector": ["gpu"]}, "node_selector"),
        ({"in_cluster": True, "api_client": None}, "in_cluster"),
        ({"kubeconfig": "/nonexistent/kubeconfig", "api_client": None}, "kubeconfig"),
    ):
        with pytest.raises(InvalidInput) as err:
            KubernetesRunner(**{"image": IMAGE, "api_client": client, **options})
        assert err.value.field == name, options


# ----------------------------------------------------- the client against a scripted API server


@pytest.fixture
def api() -> Iterator[K8sApi]:
    with serve(VERSIONS) as server:
        yield server


def runner_for(api: K8sApi, **options: Any) -> KubernetesRunner:
    client = k8s.ApiClient(k8s.Configuration(host=api.url))
    opts = {"image": IMAGE, "poll_interval_s": 0.0, "api_client": client, **options}
    return KubernetesRunner(**opts)


def test_a_job_that_completes_reports_its_metrics_and_is_deleted(api: K8sApi) -> None:
    api.behave(k8s_api.completes(METRICS_LOG))
    runner = runner_for(api, namespace="ml", labels={"team": "llm"})
    handle = runner.submit(trial())
    (post,) = api.sent("POST")
    assert post.path == "/apis/batch/v1/namespaces/ml/jobs"
    assert post.query["fieldValidation"] == ["Strict"]
    sent = post.body
    validate_everywhere(sent)  # what went over the wire, not what was rendered
    assert sent["metadata"]["name"] == handle.name
    assert sent["metadata"]["labels"]["cubic/trial"] == "345"
    assert sent["metadata"]["labels"]["team"] == "llm"
    assert sent["spec"]["backoffLimit"] == 0
    env = env_of(container(sent))
    assert json.loads(env["CUBIC_CONFIG_JSON"])["params"]["micro_batch"] == 4
    outcome = wait(runner, handle)
    assert outcome.state == "complete", outcome
    assert outcome.metrics == {"tokens_per_s": 4321.5, "mem_gb": 61.2}
    (pods,) = {tuple(r.query["labelSelector"]) for r in api.sent("GET", r"/pods$")}
    assert pods == (f"batch.kubernetes.io/job-name={handle.name}",)
    (logs,) = api.sent("GET", r"/log$")
    assert logs.query["container"] == ["trial"] and logs.query["tailLines"] == ["2000"]
    (delete,) = api.sent("DELETE")
    assert delete.path == f"/apis/batch/v1/namespaces/ml/jobs/{handle.name}"
    assert delete.query["propagationPolicy"] == ["Background"]
    assert runner.poll(handle) is outcome and len(api.sent("GET", "/jobs/")) == 3
    runner.cancel(handle)  # after the end: nothing more to do
    assert len(api.sent("DELETE")) == 1


def test_polls_are_rate_limited_per_trial(api: K8sApi) -> None:
    api.behave(k8s_api.runs_forever())
    runner = runner_for(api, poll_interval_s=0.2)
    handle = runner.submit(trial())
    stop = time.monotonic() + 0.5
    polls = 0
    while time.monotonic() < stop:
        assert runner.poll(handle) is None
        polls += 1
        time.sleep(0.01)
    reads = len(api.sent("GET", "/jobs/"))
    assert polls > 20 and 1 <= reads <= 3


def test_an_oom_killed_container_is_infeasible(api: K8sApi) -> None:
    api.behave(k8s_api.oom_killed("loading shards\n"))
    runner = runner_for(api)
    outcome = wait(runner, runner.submit(trial()))
    assert outcome.state == "infeasible", outcome
    assert "out of memory" in (outcome.error or "")


def test_exits_are_classified_from_the_code_and_the_log(api: K8sApi) -> None:
    cuda = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    crash = "Traceback (most recent call last):\nValueError: bad shard\n"
    api.behave(
        k8s_api.completes(cuda, exit_code=1),
        k8s_api.completes(crash, exit_code=1),
        k8s_api.completes("done, but forgot to report\n"),
    )
    runner = runner_for(api)
    oom = wait(runner, runner.submit(trial()))
    assert oom.state == "infeasible" and "CUDA out of memory" in (oom.error or "")
    failed = wait(runner, runner.submit(trial()))
    assert failed.state == "failed" and failed.error == "job exited with code 1"
    assert "ValueError: bad shard" in (failed.log_tail or "")
    silent = wait(runner, runner.submit(trial()))
    assert silent.state == "failed" and "no metrics" in (silent.error or "")


def test_an_evicted_pod_is_failed_and_retried_not_infeasible(api: K8sApi) -> None:
    api.behave(k8s_api.evicted("The node was low on resource: memory."))
    runner = runner_for(api)
    outcome = wait(runner, runner.submit(trial()))
    assert outcome.state == "failed", outcome
    assert "Evicted" in (outcome.error or "") and "low on resource" in (outcome.error or "")


def test_a_job_past_its_deadline_is_a_timeout(api: K8sApi) -> None:
    api.behave(k8s_api.deadline_exceeded())
    runner = runner_for(api)
    outcome = wait(runner, runner.submit(trial(timeout_s=600)))
    assert outcome.state == "failed" and outcome.error == "timeout after 600 s"


def test_the_runner_enforces_the_deadline_when_the_cluster_does_not(api: K8sApi) -> None:
    api.behave(k8s_api.runs_forever())
    runner = runner_for(api, deadline_slack_s=0.0)
    handle = runner.submit(trial(timeout_s=0.3))
    outcome = wait(runner, handle)
    assert outcome.state == "failed" and (outcome.error or "").startswith("timeout")
    (delete,) = api.sent("DELETE")
    assert delete.query["propagationPolicy"] == ["Background"]


def test_a_pod_that_cannot_pull_its_image_fails_after_a_grace_period(api: K8sApi) -> None:
    api.behave(k8s_api.image_pull_backoff(), k8s_api.image_pull_backoff())
    patient = runner_for(api, pending_grace_s=60.0)
    handle = patient.submit(trial())
    for _ in range(10):
        assert patient.poll(handle) is None  # still within the grace period
    assert handle.stuck_since is not None
    assert not api.sent("DELETE")
    runner = runner_for(api, pending_grace_s=0.2)
    handle = runner.submit(trial())
    started = time.monotonic()
    outcome = wait(runner, handle)
    assert time.monotonic() - started >= 0.2
    assert outcome.state == "failed", outcome
    assert "ImagePullBackOff" in (outcome.error or "") and IMAGE in (outcome.error or "")
    assert [r.path.rsplit("/", 1)[1] for r in api.sent("DELETE")] == [handle.name]


def test_cancel_deletes_the_job_in_the_background_and_is_idempotent(api: K8sApi) -> None:
    api.behave(k8s_api.runs_forever(), k8s_api.runs_forever())
    runner = runner_for(api)
    handle = runner.submit(trial())
    assert runner.poll(handle) is None
    runner.cancel(handle)
    (delete,) = api.sent("DELETE")
    assert delete.query["propagationPolicy"] == ["Background"]
    assert ("default", handle.name) not in api.jobs
    runner.cancel(handle)
    assert len(api.sent("DELETE")) == 1
    outcome = runner.poll(handle)
    assert outcome is not None and outcome.state == "failed" and outcome.error == "cancelled"
    other = runner.submit(trial())
    api.forget("default", other.name)  # somebody deleted it already: a 404 is fine
    runner.cancel(other)
    assert len(api.sent("DELETE")) == 2 and other.deleted


def test_a_job_deleted_behind_the_runners_back_is_lost(api: K8sApi) -> None:
    api.behave(k8s_api.runs_forever())
    runner = runner_for(api)
    handle = runner.submit(trial())
    api.forget("default", handle.name)
    outcome = wait(runner, handle)
    assert outcome.state == "failed" and "deleted outside cubic" in (outcome.error or "")


def test_api_errors_are_clear_and_transient_ones_are_retried(api: K8sApi) -> None:
    runner = runner_for(api)
    api.fail("POST", "/jobs$", 403, "Forbidden", 'jobs.batch is forbidden: User "w" cannot create')
    with pytest.raises(
        KubernetesError, match=r"create Job.*HTTP 403 Forbidden.*cannot create"
    ) as err:
        runner.submit(trial())
    assert err.value.status == 403 and err.value.reason == "Forbidden"
    api.behave(k8s_api.completes(METRICS_LOG))
    handle = runner.submit(trial())
    api.fail("GET", "/jobs/", 503, "ServiceUnavailable", "etcdserver: leader changed", times=2)
    assert runner.poll(handle) is None and runner.poll(handle) is None
    assert wait(runner, handle).state == "complete"
    api.behave(k8s_api.runs_forever())
    handle = runner.submit(trial())
    api.fail("GET", "/jobs/", 401, "Unauthorized", "token expired")
    with pytest.raises(KubernetesError, match="HTTP 401"):
        runner.poll(handle)
    api.fail("DELETE", "/jobs/", 403, "Forbidden", "cannot delete")
    with pytest.raises(KubernetesError, match=r"delete Job.*403"):
        runner.cancel(handle)
    runner.cancel(handle)  # the retry goes through
    assert handle.deleted


def test_the_api_refuses_what_the_schema_refuses(api: K8sApi, tmp_path: Path) -> None:
    """The scripted server validates every Job it receives against the published schemas, as
    the API server's strict field validation would; the runner's typed client refuses such a
    Job before sending it."""
    broken = render_manifest(trial(), ManifestOptions(image=IMAGE))
    broken["spec"]["template"]["spec"]["containers"][0]["nodeSelector"] = {"pool": "gpu"}
    request = urllib.request.Request(
        f"{api.url}/apis/batch/v1/namespaces/default/jobs?fieldValidation=Strict",
        data=json.dumps(broken).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    answer = json.loads(err.value.read())
    assert err.value.code == 422 and answer["reason"] == "Invalid"
    assert "nodeSelector" in answer["message"]
    assert not api.jobs
    path = tmp_path / "broken.j2"
    path.write_text(BROKEN_TEMPLATE)
    templated = runner_for(api, template=str(path))
    if hasattr(k8s.V1Job, "model_validate"):
        with pytest.raises(InvalidInput) as refused:
            templated.submit(trial())
        assert refused.value.field == "template"
        assert len(api.sent("POST")) == 1  # only the raw request above reached the server


def test_check_refuses_a_study_whose_job_cannot_be_made(tmp_path: Path) -> None:
    client = k8s.ApiClient(k8s.Configuration(host="http://unused"))
    spec = {"name": "s", "workload": trial().workload, "job": {"command": "python t.py"}}
    KubernetesRunner(image=IMAGE, api_client=client).check(spec)
    with pytest.raises(InvalidInput) as err:
        KubernetesRunner(image=IMAGE, api_client=client).check({"name": "s", "job": {}})
    assert err.value.field == "job.command"
    path = tmp_path / "t.j2"
    path.write_text(USER_TEMPLATE.replace("{{ gpus }}", "{{ params.tp * 4 }}"))
    KubernetesRunner(template=str(path), api_client=client).check(spec)  # knobs: per trial
    path.write_text(BROKEN_TEMPLATE)
    with pytest.raises(InvalidInput) as err:
        KubernetesRunner(template=str(path), api_client=client).check(spec)
    assert err.value.field == "template"
    with pytest.raises(InvalidInput) as err:  # a GPU count that is not a number
        KubernetesRunner(image=IMAGE, api_client=client).check(
            {**spec, "job": {"command": "x", "resources": {"gpus_per_node": "eight"}}}
        )
    assert err.value.field == "job.resources.gpus_per_node"


def test_a_job_run_by_the_scripted_kubelet_gets_its_config_and_reports(
    api: K8sApi, tmp_path: Path
) -> None:
    """The container's own command runs here: it writes CUBIC_CONFIG from CUBIC_CONFIG_JSON,
    the job reads its knobs through the SDK and prints the metrics line the runner parses."""
    command = (
        f"{PY} -c 'from cubic.job import load_config, report; c = load_config(); "
        'report(tokens_per_s=100.0 * c["micro_batch"] * c["tp"])\''
    )
    api.behave(k8s_api.executes(tmp_path))
    runner = runner_for(api)  # the default remote_dir, /tmp/cubic, private to each pod
    job = replace(trial(), job={"command": command})
    handle = runner.submit(job)
    outcome = wait(runner, handle, limit=60)
    assert outcome.state == "complete", outcome
    assert outcome.metrics == {"tokens_per_s": 800.0}
    (pod,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith(handle.name)]
    assert json.loads((pod / "config.json").read_text())["params"] == job.params


# ------------------------------------------------------------- a worker against both servers


def test_a_worker_runs_a_study_through_the_kubernetes_runner(api: K8sApi, tmp_path: Path) -> None:
    from cubic.bench.service import api_server, study_spec
    from cubic.client import CubicClient
    from cubic.runners import make_runner
    from cubic.store.schema import upgrade
    from cubic.worker import Worker

    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    spec = study_spec(4, 2, "random")
    spec["job"] = {
        "command": f"{PY} -c 'from cubic.job import load_config, report; "
        'report(tokens_per_s=100.0 * load_config()["micro_batch"])\'',
        "resources": {"gpus_per_node": 0, "cpus": 1},
    }
    api.behave(*[k8s_api.executes(tmp_path) for _ in range(8)])
    runner = make_runner(
        "kubernetes",
        image=IMAGE,
        namespace="default",
        poll_interval_s=0.05,
        api_client=k8s.ApiClient(k8s.Configuration(host=api.url)),
    )
    with api_server(db, 1) as url, CubicClient(url) as client:
        sid = client.create_study(spec)["id"]
        worker = Worker(client, sid, runner, parallel=2, idle_s=0.1)
        assert worker.run() == 4
        trials = client.all_trials(sid)
    assert [t["state"] for t in trials] == ["complete"] * 4
    for t in trials:  # measured by the job from its own config
        assert t["metrics"] == {"tokens_per_s": 100.0 * t["params"]["micro_batch"]}
    posted = api.sent("POST")
    assert len(posted) == 4 and len(api.sent("DELETE")) == 4
    for r in posted:
        validate_everywhere(r.body)
        assert "nvidia.com/gpu" not in json.dumps(r.body["spec"]["template"]["spec"])
    assert {r.body["metadata"]["labels"]["cubic/study"] for r in posted} == {str(sid)}
