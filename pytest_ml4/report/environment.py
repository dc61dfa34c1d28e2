"""Allure ``environment.properties`` and ``executor.json``, and the versions a run records.

* :func:`environment_properties` describes the run for the Overview page's Environment widget: target,
  hardware, topology, model, serving stack, engine version (from the endpoint's ``/version``), simulated or
  live, suite version, git sha. No URL with credentials and no key ever goes in.
* :func:`executor_from_env` reads the CI's environment (GitHub Actions, GitLab CI, Jenkins) into the
  Executors widget; ``buildOrder`` orders the trend widget's builds.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from pytest_ml4.locations import PACKAGE_PARENT
from pytest_ml4.report.redact import redact
from pytest_ml4.runtime import processes
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target


def git_sha(repo: Path = PACKAGE_PARENT) -> str:
    """Commit of the suite's checkout (``unknown`` outside a git checkout), ``+dirty`` when modified."""
    env_sha = os.environ.get("ML4_GIT_SHA")  # set by the container build, which has no .git
    if env_sha:
        return env_sha
    if not (repo / ".git").exists():
        return "unknown"  # an installed copy: a git repository above site-packages is not the suite's
    try:
        sha = processes.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        # Tracked files changed since the commit: the run did not test exactly that commit.
        dirty = processes.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def package_version(name: str) -> str:
    """Installed version of a distribution, or ``unknown``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def engine_version(urls: list[str], timeout: float = 3.0) -> str | None:
    """The engine's version from ``GET <root>/version`` (vLLM: ``{"version": "0.33.0"}``), first URL that answers.

    ``urls`` are server roots or ``.../v1`` bases (the suffix is dropped). A proxy (LiteLLM) or Dynamo frontend
    has no ``/version``; then None, and the caller reports the target's configured version instead.
    """
    for url in urls:
        root = url.rstrip("/").removesuffix("/metrics").removesuffix("/v1")
        try:
            resp = httpx.get(root + "/version", timeout=timeout)
            if resp.status_code == 200:
                version = resp.json().get("version")
                if isinstance(version, str) and version:
                    return version
        except Exception:  # noqa: BLE001, S112 - best effort: a version probe must never break the session
            # (not just httpx.HTTPError: under pytester's in-process runs httpx may be a re-imported copy)
            continue
    return None


def environment_properties(target: Target | None, *, simulated: bool, engine: str | None = None,
                           faults: tuple[str, ...] = (), extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Key/value pairs for the Environment widget, most important first (the widget shows the first five)."""
    props: dict[str, str] = {}
    if target is not None:
        props["Target"] = target.name
    props["Endpoint"] = "simulated (embedded vLLM simulator)" if simulated else "live deployment"
    if faults:
        props["Injected faults"] = ", ".join(faults)
    if target is not None:
        props["Engine version"] = engine or f"{target.engine.version} (configured; endpoint has no /version)"
        props["Model"] = f"{target.serving.served_model_name} ({target.engine.model_path})"
    props["Suite version"] = f"pytest-ml4 {package_version('pytest-ml4')}"
    props["Git sha"] = git_sha()
    if target is not None:
        nodes = f" ({target.hardware.nodes} nodes)" if target.hardware.nodes > 1 else ""
        props["Hardware"] = f"{target.hardware.count}x {target.hardware.gpu}{nodes}"
        props["Topology"] = f"{target.topology.kind}, TP={target.topology.tensor_parallel}"
        props["Serving"] = stack_for(target).name
    props["Python"] = platform.python_version()
    props["pytest"] = package_version("pytest")
    props.update(extra or {})
    return redact(props)


def _escape(text: str, key: bool = False) -> str:
    # java.util.Properties escaping: backslash, newlines; in keys also ':', '=' and spaces.
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        for ch in (" ", ":", "="):
            text = text.replace(ch, "\\" + ch)
    return text


def write_environment(alluredir: Path, props: Mapping[str, str]) -> Path:
    """Write ``environment.properties`` (Java properties format, UTF-8) into the results folder."""
    alluredir.mkdir(parents=True, exist_ok=True)
    lines = [f"{_escape(k, key=True)}={_escape(str(v))}" for k, v in props.items()]
    path = alluredir / "environment.properties"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_environment(path: Path) -> dict[str, str]:
    """Parse an ``environment.properties`` written by :func:`write_environment`."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        i = 0
        while i < len(line) and not (line[i] == "=" and (i == 0 or line[i - 1] != "\\")):
            i += 1
        key, value = line[:i], line[i + 1:]
        unescape = {"\\ ": " ", "\\:": ":", "\\=": "=", "\\n": "\n", "\\r": "\r", "\\\\": "\\"}
        for k, v in unescape.items():
            key, value = key.replace(k, v), value.replace(k, v)
        out[key] = value
    return out


def executor_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Allure ``executor.json`` for where this runs: GitHub Actions, GitLab CI, Jenkins, a Kubernetes Job, else local."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") == "true":
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        run_url = f"{server}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/{env.get('GITHUB_RUN_ID', '')}"
        ex = {"name": "GitHub Actions", "type": "github", "url": f"{server}/{env.get('GITHUB_REPOSITORY', '')}",
              "buildOrder": _int(env.get("GITHUB_RUN_NUMBER")),
              "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{env.get('GITHUB_RUN_NUMBER', '?')}",
              "buildUrl": run_url}
    elif env.get("GITLAB_CI") == "true":
        ex = {"name": "GitLab CI", "type": "gitlab", "url": env.get("CI_PROJECT_URL", ""),
              "buildOrder": _int(env.get("CI_PIPELINE_IID")),
              "buildName": f"{env.get('CI_JOB_NAME', 'job')} #{env.get('CI_PIPELINE_IID', '?')}",
              "buildUrl": env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL", "")}
    elif env.get("JENKINS_URL"):
        ex = {"name": "Jenkins", "type": "jenkins", "url": env.get("JENKINS_URL", ""),
              "buildOrder": _int(env.get("BUILD_NUMBER")),
              "buildName": env.get("BUILD_TAG") or f"{env.get('JOB_NAME', 'job')} #{env.get('BUILD_NUMBER', '?')}",
              "buildUrl": env.get("BUILD_URL", "")}
    elif env.get("KUBERNETES_SERVICE_HOST"):
        # In-cluster Job (examples/kubernetes): the pod name says which Job run this was.
        pod = env.get("HOSTNAME", "")
        ex = {"name": "Kubernetes Job", "type": "kubernetes",
              "buildName": f"{pod} in {env.get('ML4_NAMESPACE', 'cluster')}" if pod else "in-cluster run"}
    else:
        ex = {"name": "local", "type": "local", "buildName": f"local run on {platform.node()}"}
    if env.get("ML4_REPORT_URL"):  # where CI publishes the HTML; Allure links trend points to it
        ex["reportUrl"] = env["ML4_REPORT_URL"]
    ex["reportName"] = "pytest-ml4 release sign-off"
    # CI URLs can carry tokens (e.g. a Jenkins URL with user:token@); never write them raw.
    return redact({k: v for k, v in ex.items() if v not in (None, "")})


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def write_executor(alluredir: Path, executor: Mapping[str, Any]) -> Path:
    """Write ``executor.json`` into the results folder."""
    alluredir.mkdir(parents=True, exist_ok=True)
    path = alluredir / "executor.json"
    path.write_text(json.dumps(dict(executor), indent=2), encoding="utf-8")
    return path
