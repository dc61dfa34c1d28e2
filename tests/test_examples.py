"""The CI recipes and the in-cluster Job in examples/: they parse, say what they must, and the Kubernetes
manifests deserialize into the official client's models without losing a field (a typo'd key would be dropped)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from pytest_ml4.report.redact import Redactor
from pytest_ml4.targets import known_targets, load_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KINDS = {("batch/v1", "Job"): "V1Job", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
         ("v1", "ServiceAccount"): "V1ServiceAccount",
         ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
         ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding"}


def _model(api: ApiClient, doc: dict[str, Any]) -> Any:
    """The manifest as the official client's model (kubernetes 37: deserialize(text, type, content_type))."""
    return api.deserialize(json.dumps(doc), KINDS[(doc["apiVersion"], doc["kind"])], "application/json")


def _manifests() -> list[dict[str, Any]]:
    return [d for p in sorted((EXAMPLES / "kubernetes").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _strip_empty(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_empty(v) for k, v in obj.items() if v not in (None, [], {})}
    if isinstance(obj, list):
        return [_strip_empty(v) for v in obj]
    return obj


@pytest.mark.parametrize("path", sorted(p.name for p in EXAMPLES.rglob("*.y*ml")))
def test_yaml_parses_and_holds_no_secret(path: str) -> None:
    (file,) = list(EXAMPLES.rglob(path))
    text = file.read_text()
    assert [d for d in yaml.safe_load_all(text) if d], f"{path} is empty"
    assert Redactor().find_leaks(text) == [], "recipes name secrets, they never contain them"


def test_github_workflow_gates_after_deploy_and_nightly() -> None:
    wf = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    on = wf.get("on", wf.get(True))   # YAML 1.1 reads a bare `on:` key as True
    assert {"workflow_dispatch", "repository_dispatch", "schedule"} <= set(on)
    assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", on["schedule"][0]["cron"])
    steps = wf["jobs"]["gate"]["steps"]
    scripts = "\n".join(s.get("run", "") for s in steps)
    assert "python -m pytest suites/" in scripts and "--junitxml=" in scripts
    for cmd in ("ml4-report generate", "ml4-report compare", "ml4-report scan", "ml4-report latest"):
        assert cmd in scripts, cmd
    assert wf["jobs"]["gate"]["env"]["LLM_API_KEY"] == "${{ secrets.LLM_API_KEY }}"
    # The job summary shows the verdict lines (not judged and does not apply included), not a pass count.
    (summary,) = [s["run"] for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert "ml4-report verdict" in summary
    uses = [s["uses"] for s in steps if "uses" in s]
    assert any(u.startswith("actions/cache/restore@") for u in uses), "earlier runs feed the trend"
    assert any(u.startswith("actions/upload-artifact@") for u in uses)


def test_gitlab_job_gates_after_deploy_and_nightly() -> None:
    ci = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())
    gate, nightly = ci["ml4:gate"], ci["ml4:nightly-compare"]
    sources = " ".join(r["if"] for r in gate["rules"])
    assert '"schedule"' in sources and "trigger" in sources
    assert "ml4-report generate" in " ".join(gate["after_script"])
    assert "ml4-report verdict" in " ".join(gate["after_script"])
    assert gate["artifacts"]["reports"]["junit"] == "reports/junit.xml"
    assert gate["resource_group"].startswith("ml4-")
    assert any("ml4-report compare" in line for line in nightly["script"])
    assert ci[".ml4"]["cache"][1]["paths"] == ["reports/"]


def test_kubernetes_manifests_deserialize_into_client_models_without_loss() -> None:
    api = ApiClient()
    docs = _manifests()
    assert {(d["apiVersion"], d["kind"]) for d in docs} == set(KINDS)
    for doc in docs:
        model = _model(api, doc)
        back = _strip_empty(api.sanitize_for_serialization(model))
        assert back == _strip_empty(doc), f"{doc['kind']} {doc['metadata']['name']}: a field is unknown or misspelt"


def test_job_runs_the_suite_against_the_frontend_and_keeps_the_report() -> None:
    api = ApiClient()
    docs = {d["kind"]: d for d in _manifests()}
    job = _model(api, docs["Job"])
    pod = job.spec.template.spec
    (container,) = pod.containers
    env = {e.name: e.value for e in container.env}
    target = load_target(env["ML4_TARGET"])
    assert env["ML4_TARGET"] in known_targets() and target.is_dynamo
    assert env["DGD"] == target.logs.dgd
    assert env["ENDPOINT"] == f"{env['DGD']}-frontend:8000"
    assert env[target.endpoint.url_env] == "http://$(ENDPOINT)/v1"
    assert pod.restart_policy == "Never" and pod.service_account_name == docs["ServiceAccount"]["metadata"]["name"]
    script = container.args[0]
    assert "python -m pytest suites/" in script and "--ml4-reports" in script
    assert "ml4-report generate" in script and "ml4-report compare" in script and "ml4-report verdict" in script
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    claim = next(v.persistent_volume_claim.claim_name for v in pod.volumes if v.persistent_volume_claim)
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert env["ML4_REPORTS"].startswith(mounts["reports"] + "/")
    terms = pod.affinity.pod_affinity.preferred_during_scheduling_ignored_during_execution
    selector = {e.key: e.values for e in terms[0].pod_affinity_term.label_selector.match_expressions}
    assert selector == {"nvidia.com/dynamo-component-type": ["frontend"],
                        "nvidia.com/dynamo-graph-deployment-name": [env["DGD"]]}
    role = docs["Role"]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in role["rules"]), "the gate only reads"


def test_containerfile_installs_through_the_project_scripts() -> None:
    text = (EXAMPLES / "Containerfile").read_text()
    assert re.search(r"^FROM \S+python:3\.11", text, re.MULTILINE)
    assert "bash scripts/install.sh" in text and "ML4_TOOLS=" in text
    assert re.search(r"^USER \d+", text, re.MULTILINE), "runs as a non-root user"
    assert "ENTRYPOINT" in text and "--ml4-reports" in text


def test_nightly_script_is_valid_bash_and_every_example_is_documented() -> None:
    import subprocess

    script = EXAMPLES / "nightly-sim.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    text = script.read_text()
    assert "--sim" in text and "ml4-report compare" in text and "ml4-report generate" in text
    readme = (EXAMPLES / "README.md").read_text()
    for path in EXAMPLES.rglob("*"):
        if path.is_file() and path.name != "README.md":
            assert f"`{path.relative_to(EXAMPLES)}`" in readme, f"{path.name} is not described in examples/README.md"


def _bash_syntax_ok(script: str) -> str:
    import subprocess

    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    return proc.stderr if proc.returncode else ""


def test_every_shell_snippet_in_the_recipes_is_valid_bash() -> None:
    wf = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    snippets = [s["run"] for s in wf["jobs"]["gate"]["steps"] if "run" in s]
    ci = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())
    for job in ci.values():
        if isinstance(job, dict):
            for key in ("before_script", "script", "after_script"):
                snippets += job.get(key, [])
    job = next(d for d in _manifests() if d["kind"] == "Job")
    snippets.append(job["spec"]["template"]["spec"]["containers"][0]["args"][0])
    assert len(snippets) >= 10
    errors = {s[:60]: err for s in snippets if (err := _bash_syntax_ok(s))}
    assert not errors, errors
