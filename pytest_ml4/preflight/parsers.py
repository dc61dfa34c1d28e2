"""Parsers: file text -> preflight documents.

* systemd units (``ExecStart=vllm serve ...``, ``Environment=``, ``EnvironmentFile=``) and shell scripts
  (``vllm serve`` launches and ``aiperf profile`` runs, with continuations, loops and ``${VAR}``);
* DynamoGraphDeployment manifests, v1alpha1 (``spec.services`` map) and v1beta1 (``spec.components`` list),
  detected the way upstream's ``tests/deploy/dgd_utils.py::_detect_schema`` does (reference dynamo.md §1.2);
* LiteLLM proxy configs (``model_list``);
* aiperf perf Jobs / CronJobs / ConfigMaps (the script in the container) and plain aiperf command lines.

Secrets are never stored: a literal secret becomes a :class:`SecretLiteral` naming where it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import yaml

from pytest_ml4.preflight.args import parse_flags
from pytest_ml4.preflight.model import (
    UNKNOWN_HARDWARE,
    AiperfInvocation,
    DgdComponent,
    DgdDocument,
    Document,
    EngineArgs,
    FrontendArgs,
    HardwareInfo,
    LiteLLMConfig,
    PerfRun,
    SecretLiteral,
    VllmLaunch,
)
from pytest_ml4.preflight.shell import (
    ShellScript,
    find_program,
    is_run_unique,
    logical_lines,
    parse_script,
    split_words,
)
from pytest_ml4.target.hardware import family_of_product

#: Annotation a DGD / Job carries when it is a pure performance run (synthetic acceptance allowed there).
RUN_PURPOSE_ANNOTATION = "pytest-ml4/run-purpose"
REDACTED = "<redacted>"
_COMMENT_TARGET = re.compile(r"^\s*#\s*ml4-target:\s*(\S+)", re.MULTILINE)
_COMMENT_PURPOSE = re.compile(r"^\s*#\s*ml4-run-purpose:\s*(\S+)", re.MULTILINE)
# Env/config names that hold secrets: a name component "key", "token", "secret", "password" (not "tokens").
_SECRET_PART = {"key", "apikey", "token", "secret", "password", "passwd", "credentials"}
_FIELD_REF_UNIQUE = {"metadata.name", "metadata.uid"}  # differ for every pod, so per run


def is_secret_name(name: str) -> bool:
    parts = {p for p in re.split(r"[_\-.]", name.lower()) if p}
    return bool(parts & _SECRET_PART)


def is_reference(value: str) -> bool:
    """A value that points at a secret instead of being one: ``$VAR``, ``${VAR}``, ``os.environ/VAR``."""
    v = value.strip()
    return v in ("", REDACTED) or v.startswith(("$", "os.environ/", "%"))


# A password inside a URL (postgresql://user:pw@host); a ${VAR} / os.environ/ password is a reference.
_URL_PASSWORD = re.compile(r"://[^/\s:@]+:(?P<pw>[^/\s@]+)@")


def literal_secret(name: str, value: str) -> bool:
    """A secret written out: a secret-named setting with a literal value, or any value with a URL password."""
    if is_secret_name(name) and not is_reference(value):
        return True
    m = _URL_PASSWORD.search(value)
    return bool(m) and not is_reference(m.group("pw"))


def comment_target(text: str) -> str | None:
    m = _COMMENT_TARGET.search(text)
    return m.group(1) if m else None


def comment_purpose(text: str) -> str | None:
    m = _COMMENT_PURPOSE.search(text)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------------------------- systemd


def parse_systemd_unit(text: str, path: str) -> list[Document]:
    env: dict[str, str] = {}
    env_files: list[str] = []
    secrets: list[SecretLiteral] = []
    execs: list[tuple[int, str]] = []
    purpose = comment_purpose(text)
    for lineno, line in logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;[":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Environment":
            for word in split_words(value):
                name, eq, val = word.partition("=")
                if not eq:
                    continue
                env[name] = val
                if literal_secret(name, val):
                    secrets.append(SecretLiteral(name=name, line=lineno, where="Environment="))
        elif key == "EnvironmentFile":
            env_files.append(value.lstrip("-"))
        elif key == "ExecStart":
            execs.append((lineno, value.lstrip("-@:+!")))
        elif key == "X-ML4-Run-Purpose":
            purpose = value
    docs: list[Document] = []
    for lineno, command in execs:
        script = parse_script(command, base_env=env)
        for launch in _vllm_launches(script, path, "systemd", lineno):
            launch.env_files = env_files
            launch.secrets = secrets + launch.secrets
            launch.run_purpose = purpose
            docs.append(launch)
    if not docs and secrets:
        # A unit without a vLLM launch still must not carry a literal key.
        docs.append(Document(path=path, kind="systemd", secrets=secrets))
    return docs


def _vllm_launches(script: ShellScript, path: str, kind: str,
                   line_offset: int | None = None) -> Iterable[VllmLaunch]:
    """Every ``vllm serve`` in ``script``; the environment is the script's variables (unit Environment= included)."""
    for cmd in script.commands:
        found = find_program(cmd.argv)
        if not found or found[0] != "vllm serve":
            continue
        prog, start = found
        line = line_offset if line_offset is not None else cmd.line
        raw = parse_flags(prog, cmd.argv[start:], line)
        secrets = _flag_secrets(raw, line, "vllm serve")
        engine = parse_flags(prog, [script.expand(w) for w in cmd.argv[start:]], line)
        _flag_secrets(engine, line, "vllm serve")  # blanks values that came in through ${VAR} expansion
        yield VllmLaunch(path=path, kind=kind, engine=engine, env=redact_env(script.variables), secrets=secrets,
                         line=line)


def _flag_secrets(args: EngineArgs, line: int | None, where: str) -> list[SecretLiteral]:
    """Literal values of secret flags (``--api-key sk-...``); the values are then blanked in ``args``."""
    out = []
    for name, values in args.flags.items():
        if is_secret_name(name) and any(v is not None and not is_reference(v) for v in values):
            out.append(SecretLiteral(name=f"--{name}", line=line, where=where))
            args.flags[name] = [REDACTED if v is not None and not is_reference(v) else v for v in values]
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with literal values of secret-named variables replaced, so no document repr holds a secret."""
    return {k: (REDACTED if literal_secret(k, v) else v) for k, v in env.items()}


# ---------------------------------------------------------------------------------------------- shell


def parse_shell(text: str, path: str) -> list[Document]:
    script = parse_script(text)
    purpose = comment_purpose(text)
    docs: list[Document] = []
    for launch in _vllm_launches(script, path, "shell"):
        launch.run_purpose = purpose
        docs.append(launch)
    perf = _perf_from_script(script, path, kind="shell", env={}, name="")
    if perf is not None:
        perf.run_purpose = purpose
        docs.append(perf)
    return docs


def _perf_from_script(script: ShellScript, path: str, *, kind: str, env: dict[str, str], name: str,
                      line_offset: int = 0) -> PerfRun | None:
    invocations: list[AiperfInvocation] = []
    secrets: list[SecretLiteral] = []
    for cmd in script.commands:
        found = find_program(cmd.argv)
        if not found or found[0] != "aiperf profile":
            continue
        line = cmd.line + line_offset
        args = parse_flags("aiperf profile", cmd.argv[found[1]:], line)
        secrets += _flag_secrets(args, line, "aiperf profile")
        art = args.get("output-artifact-dir") or args.get("artifact-dir")
        invocations.append(AiperfInvocation(args=args, line=line, loop_vars=cmd.loop_vars, artifact_dir=art))
    if not invocations:
        return None
    return PerfRun(path=path, kind=kind, name=name, invocations=invocations,
                   env=redact_env({**env, **script.variables}),
                   run_unique_vars=frozenset(script.run_unique_vars), secrets=secrets,
                   line=invocations[0].line)


# ---------------------------------------------------------------------------------------------- YAML


def yaml_documents(text: str) -> list[tuple[int, Any]]:
    """Each YAML document with the 1-based line it starts on (for finding locations)."""
    out: list[tuple[int, Any]] = []
    start = 1
    chunk: list[str] = []
    lines = text.splitlines()
    for no, line in enumerate(lines + ["---"], start=1):
        if re.match(r"^---\s*$", line):
            body = "\n".join(chunk)
            if body.strip():
                out.append((start, yaml.safe_load(body)))
            chunk = []
            start = no + 1
            continue
        chunk.append(line)
    return out


def find_line(text_lines: list[str], start: int, pattern: str) -> int | None:
    rx = re.compile(pattern)
    for no in range(max(start - 1, 0), len(text_lines)):
        if rx.search(text_lines[no]):
            return no + 1
    return None


def parse_yaml(text: str, path: str) -> list[Document]:
    docs: list[Document] = []
    lines = text.splitlines()
    purpose = comment_purpose(text)
    for start, data in yaml_documents(text):
        if not isinstance(data, dict):
            continue
        kind = data.get("kind")
        if kind == "DynamoGraphDeployment":
            doc = parse_dgd(data, path, lines, start)
        elif "model_list" in data:
            secrets = _litellm_secrets(data, lines, start)
            doc = LiteLLMConfig(path=path, kind="litellm", data=_redact_tree(data), line=start, secrets=secrets)
        elif kind in ("Job", "CronJob", "ConfigMap", "Pod"):
            doc = parse_perf_manifest(data, path, lines, start)
        else:
            doc = None
        if doc is None:
            continue
        if purpose and not doc.run_purpose:
            doc.run_purpose = purpose
        docs.append(doc)
    return docs


# ---------------------------------------------------------------------------------------------- DGD


def parse_dgd(data: dict[str, Any], path: str, lines: list[str], start: int) -> DgdDocument:
    meta = data.get("metadata") or {}
    spec = data.get("spec") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    doc = DgdDocument(path=path, kind="dgd", name=str(meta.get("name", "")), namespace=meta.get("namespace"),
                      api_version=str(data.get("apiVersion", "")), annotations=annotations, line=start,
                      run_purpose=annotations.get(RUN_PURPOSE_ANNOTATION))
    doc.hardware = infer_hardware(data)
    global_env = _env_list(spec.get("env") or spec.get("envs") or [])
    if isinstance(spec.get("services"), dict):  # v1alpha1
        items = [(name, comp or {}, True) for name, comp in spec["services"].items()]
    else:  # v1beta1
        items = [(str(c.get("name", "")), c, False) for c in spec.get("components") or [] if isinstance(c, dict)]
    for name, comp, alpha in items:
        component = _dgd_component(name, comp, alpha, global_env, doc, lines, start)
        doc.components.append(component)
    return doc



def _gpu_products(obj: Any) -> list[str]:
    found: list[str] = []
    if isinstance(obj, dict):
        if obj.get("key") == "nvidia.com/gpu.product":
            found += [str(v) for v in obj.get("values") or []]
        if "nvidia.com/gpu.product" in obj and not isinstance(obj["nvidia.com/gpu.product"], (dict, list)):
            found.append(str(obj["nvidia.com/gpu.product"]))
        for value in obj.values():
            found += _gpu_products(value)
    elif isinstance(obj, list):
        for value in obj:
            found += _gpu_products(value)
    return found


def infer_hardware(data: dict[str, Any]) -> HardwareInfo:
    """The GPU family from a ``nvidia.com/gpu.product`` node affinity/selector (reference dynamo.md §8)."""
    for product in _gpu_products(data):
        family = family_of_product(product)  # pytest_ml4/data/hardware/families.yaml
        if family is not None:
            return HardwareInfo(family=family, origin=f"node affinity {product}")
    return UNKNOWN_HARDWARE


def _env_list(items: Any) -> tuple[dict[str, str], dict[str, str]]:
    """Kubernetes ``env`` list -> (plain values, names whose value comes from a ref -> ref kind)."""
    values: dict[str, str] = {}
    refs: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or "name" not in item:
            continue
        name = str(item["name"])
        if "value" in item:
            values[name] = "" if item["value"] is None else str(item["value"])
        elif isinstance(item.get("valueFrom"), dict):
            vf = item["valueFrom"]
            field_path = (vf.get("fieldRef") or {}).get("fieldPath", "")
            refs[name] = f"fieldRef:{field_path}" if field_path else next(iter(vf), "ref")
    return values, refs


def _main_container(comp: dict[str, Any], alpha: bool) -> dict[str, Any]:
    if alpha:
        return ((comp.get("extraPodSpec") or {}).get("mainContainer")) or {}
    containers = (((comp.get("podTemplate") or {}).get("spec") or {}).get("containers")) or []
    for c in containers:
        if isinstance(c, dict) and c.get("name") == "main":
            return c
    return containers[0] if containers and isinstance(containers[0], dict) else {}


def container_script(container: dict[str, Any]) -> tuple[str, bool]:
    """The text a container runs: (script, is_shell).  ``sh -c SCRIPT`` gives the script itself."""
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    for i, w in enumerate(words):
        if w == "-c" and i + 1 < len(words) and words[0].rsplit("/", 1)[-1] in ("sh", "bash", "dash", "zsh"):
            return "\n".join(words[i + 1:]), True
    return " ".join(_quote(w) for w in words), False


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'" if re.search(r"[\s\"'$;&|]", word) else word


def _dgd_component(name: str, comp: dict[str, Any], alpha: bool, global_env: tuple[dict[str, str], dict[str, str]],
                   doc: DgdDocument, lines: list[str], start: int) -> DgdComponent:
    container = _main_container(comp, alpha)
    env, refs = dict(global_env[0]), dict(global_env[1])
    for source in (comp.get("envs"), container.get("env")):
        v, r = _env_list(source or [])
        env.update(v)
        refs.update(r)
    line = find_line(lines, start, rf"name:\s*['\"]?{re.escape(name)}['\"]?\s*$") or \
        find_line(lines, start, rf"^\s*{re.escape(name)}:\s*$")
    for var, value in env.items():
        if literal_secret(var, value):
            doc.secrets.append(SecretLiteral(name=var, line=line, where=f"component {name} env"))
    script_text, _ = container_script(container)
    script = parse_script(script_text, base_env=env)
    engine: EngineArgs | None = None
    frontend: FrontendArgs | None = None
    for cmd in script.commands:
        found = find_program(cmd.argv)
        if not found:
            continue
        prog, idx = found
        raw = parse_flags(prog, cmd.argv[idx:], line)
        for s in _flag_secrets(raw, line, f"component {name} args"):
            doc.secrets.append(s)
        parsed = parse_flags(prog, [script.expand(w) for w in cmd.argv[idx:]], line)
        _flag_secrets(parsed, line, "")
        if prog == "dynamo.frontend":
            frontend = FrontendArgs(args=parsed, env=redact_env(env))
        elif prog in ("dynamo.vllm", "vllm serve"):
            engine = parsed
    role = _role(comp, alpha, engine, frontend)
    resources = container.get("resources") or comp.get("resources") or {}
    replicas = comp.get("replicas")
    return DgdComponent(name=name, role=role, replicas=int(replicas) if isinstance(replicas, int) else None,
                        env=redact_env(env), env_refs=refs, engine=engine, frontend=frontend, resources=resources,
                        shared_memory=_shared_memory(comp), line=line,
                        image=str(container["image"]) if container.get("image") else None)


def _shared_memory(comp: dict[str, Any]) -> str | None:
    # v1beta1 ``sharedMemorySize``; v1alpha1 ``sharedMemory: {size: ...}``.
    if comp.get("sharedMemorySize") is not None:
        return str(comp["sharedMemorySize"])
    shm = comp.get("sharedMemory")
    return str(shm.get("size")) if isinstance(shm, dict) and shm.get("size") is not None else None


def _role(comp: dict[str, Any], alpha: bool, engine: EngineArgs | None, frontend: FrontendArgs | None) -> str:
    if engine is not None:
        mode = engine.disaggregation_mode()
        if mode in ("prefill", "decode"):
            return mode
        if engine.switch("is-prefill-worker"):
            return "prefill"
    ctype = str(comp.get("componentType") if alpha else comp.get("type") or "").lower()
    sub = str(comp.get("subComponentType") or "").lower()
    if ctype == "worker" and sub in ("prefill", "decode"):
        return sub
    if ctype in ("prefill", "decode", "frontend", "planner", "epp"):
        return ctype
    if frontend is not None:
        return "frontend"
    if ctype == "worker" or engine is not None:
        return "agg"
    return "other"


# ---------------------------------------------------------------------------------------------- LiteLLM


def _litellm_secrets(data: Any, lines: list[str], start: int, trail: str = "") -> list[SecretLiteral]:
    out: list[SecretLiteral] = []
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{trail}.{key}" if trail else str(key)
            if isinstance(value, (dict, list)):
                out += _litellm_secrets(value, lines, start, where)
            elif isinstance(value, str) and literal_secret(str(key), value):
                out.append(SecretLiteral(name=str(key), where=where,
                                         line=find_line(lines, start, rf"^\s*-?\s*{re.escape(str(key))}\s*:")))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            out += _litellm_secrets(item, lines, start, f"{trail}[{i}]")
    return out


def _redact_tree(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: (REDACTED if isinstance(v, str) and literal_secret(str(k), v)
                    else _redact_tree(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_redact_tree(v) for v in data]
    return data


# ---------------------------------------------------------------------------------------------- perf Jobs


def _pod_spec(data: dict[str, Any]) -> dict[str, Any]:
    spec = data.get("spec") or {}
    if data.get("kind") == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    if data.get("kind") == "Pod":
        return spec
    return ((spec.get("template") or {}).get("spec")) or {}


def _affinity_dgd(obj: Any) -> str | None:
    """The DGD a perf Job's podAffinity points at (``nvidia.com/dynamo-graph-deployment-name In [...]``)."""
    if isinstance(obj, dict):
        if obj.get("key") == "nvidia.com/dynamo-graph-deployment-name" and obj.get("values"):
            return str(obj["values"][0])
        labels = obj.get("matchLabels")
        if isinstance(labels, dict) and "nvidia.com/dynamo-graph-deployment-name" in labels:
            return str(labels["nvidia.com/dynamo-graph-deployment-name"])
        for value in obj.values():
            found = _affinity_dgd(value)
            if found:
                return found
    elif isinstance(obj, list):
        for value in obj:
            found = _affinity_dgd(value)
            if found:
                return found
    return None


#: ``aiperf kube generate --no-operator`` puts the whole run into a ConfigMap key (the JobSet's pods read it).
AIPERF_KUBE_CONFIG_KEY = "run_config.json"
#: Stands for the JobSet's controller pod in a kube run's artifact directory: aiperf writes ``/results`` on that
#: pod's own emptyDir volume, new for every submitted JobSet, so the directory is never shared between runs.
KUBE_POD_VAR = "AIPERF_KUBE_POD"


def aiperf_kube_argv(cfg: dict[str, Any]) -> list[str]:
    """The ``aiperf profile`` flags a kube run config stands for (the fields the perf rules read)."""
    argv: list[str] = []
    endpoint = cfg.get("endpoint") or {}
    for key, value in (endpoint.get("extra") or {}).items():
        argv += ["--extra-inputs", f"{key}:{json.dumps(value)}"]
    for ds in cfg.get("datasets") or []:
        osl = ((ds.get("prompts") or {}).get("osl") or {}).get("mean")
        if osl is not None:
            argv += ["--prompt-output-tokens-mean", str(int(osl))]
    if cfg.get("scenario"):
        argv += ["--scenario", str(cfg["scenario"])]
    art = (cfg.get("artifacts") or {}).get("dir")
    if art:
        argv += ["--output-artifact-dir", "${" + KUBE_POD_VAR + "}:" + str(art)]
    return argv


def _parse_kube_run_config(data: dict[str, Any], path: str, name: str, start: int) -> PerfRun | None:
    raw = (data.get("data") or {}).get(AIPERF_KUBE_CONFIG_KEY)
    try:
        cfg = (json.loads(raw) or {}).get("cfg") if isinstance(raw, str) else None
    except json.JSONDecodeError:
        return None
    if not isinstance(cfg, dict):
        return None
    args = parse_flags("aiperf profile", aiperf_kube_argv(cfg), start)
    inv = AiperfInvocation(args=args, line=start, loop_vars=frozenset(), artifact_dir=args.get("output-artifact-dir"))
    return PerfRun(path=path, kind="perf-job", name=name, invocations=[inv], env={},
                   run_unique_vars=frozenset({KUBE_POD_VAR}), line=start,
                   namespace=(data.get("metadata") or {}).get("namespace"))


def parse_perf_manifest(data: dict[str, Any], path: str, lines: list[str], start: int) -> PerfRun | None:
    meta = data.get("metadata") or {}
    name = str(meta.get("name", ""))
    annotations = meta.get("annotations") or {}
    if data.get("kind") == "ConfigMap" and AIPERF_KUBE_CONFIG_KEY in (data.get("data") or {}):
        return _parse_kube_run_config(data, path, name, start)
    if data.get("kind") == "ConfigMap":
        texts = [(str(v), {}, {}) for v in (data.get("data") or {}).values() if "aiperf" in str(v)]
    else:
        pod = _pod_spec(data)
        texts = []
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            if not isinstance(c, dict):
                continue
            env, refs = _env_list(c.get("env") or [])
            texts.append((container_script(c)[0], env, refs))
    best: PerfRun | None = None
    for text, env, refs in texts:
        unique = {n for n, r in refs.items() if r.removeprefix("fieldRef:") in _FIELD_REF_UNIQUE}
        script = parse_script(text, base_env=env, unique_vars=unique)
        line_offset = (find_line(lines, start, re.escape(text.splitlines()[0][:40])) or start) - 1 if text else 0
        perf = _perf_from_script(script, path, kind="perf-job", env=env, name=name, line_offset=line_offset)
        if perf is None:
            continue
        for var, value in env.items():
            if literal_secret(var, value):
                perf.secrets.append(SecretLiteral(name=var, where=f"Job {name} env"))
        if best is None:
            best = perf
        else:
            best.invocations += perf.invocations
            best.env.update(perf.env)
            best.secrets += perf.secrets
            best.run_unique_vars = best.run_unique_vars | perf.run_unique_vars
    if best is not None:
        best.line = start
        best.target_dgd = _affinity_dgd(data)
        best.namespace = meta.get("namespace")
        best.run_purpose = annotations.get(RUN_PURPOSE_ANNOTATION)
    return best


__all__ = [
    "comment_target",
    "is_reference",
    "is_run_unique",
    "is_secret_name",
    "literal_secret",
    "parse_dgd",
    "parse_perf_manifest",
    "parse_shell",
    "parse_systemd_unit",
    "parse_yaml",
    "yaml_documents",
]
