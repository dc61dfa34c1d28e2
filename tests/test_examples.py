"""The CI recipes and the in-cluster Job in examples/: they parse, say what they must, run the installed suite
against the team's own targets/, and the Kubernetes manifests deserialize into the official client's models
without losing a field (a typo'd key would be dropped). The RBAC they write out grants exactly the Kubernetes API
calls the package makes: each call is read from the code (its AST) and turned into the verb and resource it needs
through the official client's own request paths, so a new call without its rule fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiClient

from pytest_ml4.report.redact import Redactor
from pytest_ml4.target.model import known_targets, load_target

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PACKAGE = REPO / "pytest_ml4"
KINDS = {("batch/v1", "Job"): "V1Job", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
         ("v1", "ServiceAccount"): "V1ServiceAccount",
         ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
         ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
         ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
         ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding"}


def _model(api: ApiClient, doc: dict[str, Any]) -> Any:
    """The manifest as the official client's model (kubernetes 37: deserialize(text, type, content_type))."""
    return api.deserialize(json.dumps(doc), KINDS[(doc["apiVersion"], doc["kind"])], "application/json")


GATE_JOB = "ml4-gate-job.yaml"


def _manifests(name: str = "*.yaml") -> list[dict[str, Any]]:
    return [d for p in sorted((EXAMPLES / "kubernetes").glob(name)) for d in yaml.safe_load_all(p.read_text()) if d]


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
    assert "python -m pytest --pyargs pytest_ml4.suites --target" in scripts and "--junitxml=" in scripts
    assert "--target-dir=targets" in scripts and "suites/" not in scripts and "install.sh" not in scripts
    assert wf["jobs"]["gate"]["container"]["image"], "the installed suite runs in the runner image"
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
    assert ci[".ml4"]["cache"][0]["paths"] == ["reports/"]
    assert "/pytest-ml4-runner:" in ci[".ml4"]["image"]["name"], "the installed suite runs in the runner image"
    script = " ".join(gate["script"])
    assert "--pyargs pytest_ml4.suites" in script and "--target-dir=targets" in script and "suites/" not in script
    assert "before_script" not in ci[".ml4"], "nothing is installed at run time: the image holds the package"


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
    docs = {d["kind"]: d for d in _manifests(GATE_JOB)}
    job = _model(api, docs["Job"])
    pod = job.spec.template.spec
    (container,) = pod.containers
    env = {e.name: e.value for e in container.env}
    target = load_target(env["ML4_TARGET"])
    assert env["ML4_TARGET"] in known_targets() and target.is_dynamo
    assert env["DGD"] == target.control.dgd
    assert env["ENDPOINT"] == f"{env['DGD']}-frontend:8000"
    assert env[target.endpoint.url_env] == "http://$(ENDPOINT)/v1"
    assert pod.restart_policy == "Never" and pod.service_account_name == docs["ServiceAccount"]["metadata"]["name"]
    script = container.args[0]
    assert "python -m pytest --target" in script and "--ml4-reports" in script and "suites/" not in script
    # The team's targets/ (a ConfigMap) under the working directory --target-dir=targets is relative to.
    assert "--target-dir=targets" in script
    targets = next(v.config_map.name for v in pod.volumes if v.config_map)
    assert {m.name: m.mount_path for m in container.volume_mounts}[next(
        v.name for v in pod.volumes if v.config_map)] == f"{container.working_dir}/targets"
    assert f"create configmap {targets} --from-file=targets/" in (EXAMPLES / "kubernetes" / "ml4-gate-job.yaml").read_text()
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


def test_runner_image_pip_installs_the_package_and_aiperf_only() -> None:
    text = (EXAMPLES / "runner" / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+python:3\.11", text, re.MULTILINE)
    assert re.search(r"pip install --no-cache-dir /src\b", text), "the package is installed from its sources"
    assert not re.search(r"pip install[^\n]* (-e|--editable) ", text), "installed, not editable"
    steps = set(re.findall(r"install\.d/(\S+\.sh)", text))
    assert steps == {"10-aiperf.sh", "30-allure.sh"}, "no simulator engines (LiteLLM, Dynamo, vLLM) in a live runner"
    assert all((REPO / "scripts" / "install.d" / step).is_file() for step in steps)
    assert "COPY suites /src/suites" in text and "install.sh" not in text.replace("install.d/", "")
    assert re.search(r"^USER \d+", text, re.MULTILINE), "runs as a non-root user"
    assert '"--pyargs", "pytest_ml4.suites"' in text, "no test path: the suites the installed package carries"
    assert "docs/notes/runner-image-size.md" in text and (REPO / "docs" / "notes" / "runner-image-size.md").is_file()


# --------------------------------------------------------------------------- RBAC: exactly what the code calls
@dataclass(frozen=True)
class Permission:
    """One RBAC grant: API group, resource (``pods/log`` for a subresource), verb; namespaced or cluster-wide."""

    group: str
    resource: str
    verb: str
    namespaced: bool = True


_NAMED_VERBS = {"GET": "get", "DELETE": "delete", "PUT": "update", "PATCH": "patch", "POST": "create"}
_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
_CLIENT_METHOD = re.compile(r"^(list|read|delete|create|get|patch|replace|connect_\w+?)_\w+$")
#: The fake API server serves these calls for the tests and --sim; it makes none.
_NOT_A_CLIENT = {PACKAGE / "deploy" / "fake_k8s.py"}


def _request(method: str) -> tuple[str, str] | None:
    """(HTTP method, resource path) of an official client API method, read from the client's own serializer."""
    for name in dir(kubernetes.client):
        cls = getattr(kubernetes.client, name)
        serializer = getattr(cls, f"_{method}_serialize", None) if isinstance(cls, type) else None
        if serializer is not None:
            found = re.search(r"method='(\w+)',\s*resource_path='([^']+)'", inspect.getsource(serializer))
            assert found, f"kubernetes.client.{name}.{method}: no request path in its serializer"
            return found.group(1), found.group(2)
    return None


def permission(http: str, path: str) -> Permission:
    """The RBAC verb and resource a request needs: GET of a named object is get, of a collection list, and so on."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = len(rest) > 2 and rest[0] == "namespaces"
    rest = rest[2:] if namespaced else rest
    named = len(rest) > 1
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    return Permission(group, resource, (_NAMED_VERBS if named else _COLLECTION_VERBS)[http], namespaced)


def _value(module: str, node: ast.expr) -> str:
    """A call argument's value: a literal, or a constant of the module making the call (e.g. ``DGD_GROUP``)."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    assert isinstance(node, ast.Name), f"{module}: a custom-object call with a computed group or plural"
    return str(getattr(importlib.import_module(module), node.id))


def _calls() -> Iterator[tuple[str, Permission]]:
    """(module, permission) for every Kubernetes API call in the package: attribute calls (``core.list_namespaced_pod(``)
    and method names kept as strings for ``getattr`` (``perf/kube.py``'s creators table)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in _NOT_A_CLIENT:
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name, args = node.func.attr, node.args
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name, args = node.value, []
            else:
                continue
            request = _request(name) if _CLIENT_METHOD.match(name) else None
            if request is None:
                continue
            http, resource_path = request
            if "{group}" in resource_path:   # CustomObjectsApi: (group, version, namespace, plural, ...)
                assert args, f"{module}: {name} named without its arguments"
                resource_path = resource_path.replace("{group}", _value(module, args[0])).replace(
                    "{plural}", _value(module, args[3]))
            yield module, permission(http, resource_path)


def _rules_with_comments(path: Path) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(kind, rule, the comment line above it) for every rule of the file's Roles and ClusterRoles."""
    for text in path.read_text().split("\n---\n"):
        doc = yaml.safe_load(text)
        if not doc or doc["kind"] not in ("Role", "ClusterRole"):
            continue
        lines = text.splitlines()
        starts = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
        assert len(starts) == len(doc["rules"]), f"{path.name} {doc['metadata']['name']}: one '- apiGroups:' per rule"
        for rule, i in zip(doc["rules"], starts):
            yield doc["kind"], rule, lines[i - 1].strip()


def _grants(rule: dict[str, Any], kind: str) -> set[Permission]:
    return {Permission(g, r, v, kind == "Role") for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def _granted(name: str = "*.yaml") -> set[Permission]:
    return {p for path in sorted((EXAMPLES / "kubernetes").glob(name)) for kind, rule, _ in _rules_with_comments(path)
            for p in _grants(rule, kind)}


def test_permission_follows_kubernetes_verbs() -> None:
    assert permission("GET", "/api/v1/namespaces/{namespace}/pods") == Permission("", "pods", "list")
    assert permission("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log") == Permission("", "pods/log", "get")
    assert permission("POST", "/api/v1/namespaces") == Permission("", "namespaces", "create", namespaced=False)
    assert permission("GET", "/apis/nvidia.com/v1beta1/namespaces/{namespace}/dynamographdeployments/{name}") == \
        Permission("nvidia.com", "dynamographdeployments", "get")


def test_the_rbac_grants_exactly_the_kubernetes_calls_the_code_makes() -> None:
    needed = {perm for _, perm in _calls()}
    # What the log readers and the restart controller are known to call: the scan sees them.
    assert {Permission("", "pods", "list"), Permission("", "pods/log", "get"), Permission("", "pods", "delete"),
            Permission("nvidia.com", "dynamographdeployments", "get")} <= needed
    # Every authenticated user may ask what it may do (Kubernetes' default ClusterRole system:basic-user): the
    # access listing's self access reviews need no grant of the recipes.
    granted = _granted() | {Permission("authorization.k8s.io", "selfsubjectaccessreviews", "create", namespaced=False)}
    assert not needed - granted, f"calls no example Role grants: {sorted(needed - granted, key=str)}"
    assert not granted - needed, f"granted but never called (grant only what is used): {sorted(granted - needed, key=str)}"


def _suite_markers() -> dict[str, Path]:
    """Each suite's marker (the first of its ``pytestmark``) and its file."""
    out = {}
    for path in sorted((REPO / "suites").glob("test_*.py")):
        found = re.search(r"^pytestmark = \[?pytest\.mark\.(\w+)", path.read_text(), re.MULTILINE)
        assert found, f"{path.name}: no pytestmark"
        out[found.group(1)] = path
    return out


def _reads_logs(marker: str, suite: Path) -> bool:
    """Whether the suite (or its plugin module) asks for the engine log reader (a fixture, or the bundle's
    ``ml4.logs``)."""
    fixtures = ("ml4_logs", "ml4_boot_log", "log_reader_if_any", "ml4_restart_logs", "ml4.logs")
    plugin = PACKAGE / "plugin" / f"{marker}.py"
    texts = [suite.read_text()] + ([plugin.read_text()] if plugin.is_file() else [])
    return any(f in text for f in fixtures for text in texts)


def test_every_rule_says_which_suites_need_it() -> None:
    markers = _suite_markers()
    comments: dict[Permission, set[str]] = {}
    for path in sorted((EXAMPLES / "kubernetes").glob("*.yaml")):
        for kind, rule, comment in _rules_with_comments(path):
            found = re.match(r"# ([a-z]+(?:, [a-z]+)*)(?: \([^)]*\))?: \S", comment)
            assert found, f"{path.name}: the rule {rule} needs a comment '# SUITE[, SUITE...]: why' above it"
            names = set(found.group(1).split(", "))
            assert names <= set(markers), f"{path.name}: {sorted(names - set(markers))} are no suites"
            for perm in _grants(rule, kind):
                comments.setdefault(perm, set()).update(names)
    log_suites = {m for m, suite in markers.items() if _reads_logs(m, suite)}
    assert comments[Permission("", "pods/log", "get")] == log_suites
    assert "restart" in comments[Permission("", "pods", "delete")]


def test_the_gate_job_is_bound_to_what_its_suites_read_and_nothing_more() -> None:
    docs = _manifests(GATE_JOB)
    job = next(d for d in docs if d["kind"] == "Job")
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "RoleBinding"
             and any(s["name"] == account for s in d["subjects"])}
    assert bound == {d["metadata"]["name"] for d in docs if d["kind"] == "Role"}
    granted = _granted(GATE_JOB)
    assert {Permission("", "pods", "list"), Permission("", "pods/log", "get")} <= granted
    assert {p.verb for p in granted} <= {"get", "list"}, "the gate only reads; restart rights are a separate file"
