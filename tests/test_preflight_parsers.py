"""Preflight parsers and rule edge cases: shell/systemd command lines, vLLM flags, DGD shapes, LiteLLM retries,
aiperf runs, hardware mapping."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.preflight import Severity, lint_paths
from pytest_ml4.preflight.args import parse_flags
from pytest_ml4.preflight.loader import load_file
from pytest_ml4.preflight.model import DgdDocument, LiteLLMConfig, PerfRun, VllmLaunch
from pytest_ml4.preflight.shell import (
    is_run_unique,
    logical_lines,
    parse_script,
    split_words,
)
from pytest_ml4.target.model import load_target

RTX = "# ml4-target: rtxpro6000-tp8\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def rules_hit(path: Path, severity: Severity = Severity.ERROR) -> set[str]:
    return {f.rule_id for f in lint_paths([path]).findings if f.severity is severity}


# ------------------------------------------------------------------------------------------------ shell


def test_continuations_comments_and_separators() -> None:
    text = "vllm serve m \\\n  --port 8000 \\\n  --host 0.0.0.0 # trailing comment\necho a && echo b 2>&1 | tee x\n"
    assert logical_lines(text)[0] == (1, "vllm serve m --port 8000 --host 0.0.0.0 # trailing comment")
    script = parse_script(text)
    assert [c.argv[0] for c in script.commands] == ["vllm", "echo", "echo", "tee"]
    assert script.commands[0].argv[-1] == "0.0.0.0"
    assert script.commands[2].argv == ["echo", "b", "2>&1"]
    assert script.commands[3].line == 4


def test_words_keep_json_and_command_substitution() -> None:
    words = split_words("x --speculative-config '{\"method\": \"dspark\", \"n\": 3}' --dir \"/a/$(date +%s)\"")
    assert words == ["x", "--speculative-config", '{"method": "dspark", "n": 3}', "--dir", "/a/$(date +%s)"]


def test_loops_assignments_and_run_unique_vars() -> None:
    script = parse_script(textwrap.dedent("""
        export ROOT=/perf
        STAMP=$(date +%s)
        RUN="$ROOT/$STAMP"
        for n in 1 2; do
          aiperf profile --artifact-dir "$RUN/c$n"
        done
        aiperf profile --artifact-dir "$ROOT/fixed"
        """))
    assert script.variables["ROOT"] == "/perf"
    assert {"STAMP", "RUN"} <= script.run_unique_vars and "ROOT" not in script.run_unique_vars
    inner, outer = script.commands
    assert inner.loop_vars == {"n"} and outer.loop_vars == frozenset()
    assert is_run_unique("$RUN/c$n", script.run_unique_vars)
    assert not is_run_unique("$ROOT/fixed", script.run_unique_vars)
    assert is_run_unique("/perf/${HOSTNAME}", set())


# ------------------------------------------------------------------------------------------------ flags


def test_flag_spellings_dotted_json_and_booleans() -> None:
    args = parse_flags("vllm serve", ["/models/m", "--max_model_len=1024", "--enforce-eager", "--block-size", "64",
                                      "--speculative-config.method", "dspark",
                                      "--speculative-config.num_speculative_tokens", "3", "--seed", "-1"])
    assert args.model == "/models/m"
    assert args.number("max-model-len") == 1024 and args.block_size() == 64
    assert args.switch("enforce-eager") and args.get("seed") == "-1"
    assert args.speculative() == {"method": "dspark", "num_speculative_tokens": 3}


def test_invalid_json_flag_is_a_parse_error() -> None:
    args = parse_flags("dynamo.vllm", ["--kv-transfer-config", "{kv_connector: Nixl}"])
    assert args.parse_errors and "kv-transfer-config" in args.parse_errors[0]
    assert args.kv_transfer() is None
    assert not parse_flags("dynamo.vllm", ["--kv-transfer-config", "$KV_CFG"]).parse_errors


# ------------------------------------------------------------------------------------------------ systemd


def test_systemd_environment_quoting_and_var_expansion(tmp_path: Path) -> None:
    unit = write(tmp_path, "u.service", RTX + """
        [Service]
        Environment="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" UTIL=0.99
        ExecStart=-/usr/bin/vllm serve /m --gpu-memory-utilization ${UTIL} --max-num-batched-tokens 4096 \\
          --api-key ${VLLM_API_KEY}
        """)
    (doc,) = load_file(unit)
    assert isinstance(doc, VllmLaunch) and doc.kind == "systemd"
    assert doc.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert doc.engine.number("gpu-memory-utilization") == 0.99
    assert doc.hardware.family == "rtxpro" and doc.target is not None
    assert "rtx-util-startup-refused" in rules_hit(unit)
    assert "literal-secret" not in rules_hit(unit)


def test_seed_edge_0983_boots_then_ooms(tmp_path: Path) -> None:
    # seeds/000: 0.98-0.983 started and died on the workspace; only 0.99 was refused.
    unit = write(tmp_path, "u.service", RTX + """
        [Service]
        Environment=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        ExecStart=vllm serve /m --gpu-memory-utilization 0.983 --max-num-batched-tokens 8192 --max-model-len 204800
        """)
    hit = rules_hit(unit)
    assert "rtx-moe-workspace-oom" in hit and "rtx-util-startup-refused" not in hit


def test_memory_model_flags_8192_tokens_at_097(tmp_path: Path) -> None:
    # The memory model's pool at 0.97 / 8192 batched tokens is below 256k (open item 1's floor).
    unit = write(tmp_path, "u.service", RTX + """
        [Service]
        Environment=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        ExecStart=vllm serve /m --gpu-memory-utilization 0.97 --max-num-batched-tokens 8192 --max-model-len 256000
        """)
    assert "kv-pool-below-max-model-len" in rules_hit(unit)


def test_rtx_rules_need_the_95gib_card(tmp_path: Path) -> None:
    text = """
        [Service]
        ExecStart=vllm serve /m --gpu-memory-utilization 0.99 --max-num-batched-tokens 8192
        """
    unmapped = write(tmp_path, "a.service", text)
    assert not rules_hit(unmapped) & {"rtx-util-startup-refused", "rtx-moe-workspace-oom", "rtx-expandable-segments"}
    on_gb300 = lint_paths([unmapped], load_target("gb300-agg"))
    assert not {f.rule_id for f in on_gb300.errors()} & {"rtx-util-startup-refused", "rtx-moe-workspace-oom"}
    on_rtx = lint_paths([unmapped], load_target("rtxpro6000-tp8"))
    assert {"rtx-util-startup-refused", "rtx-expandable-segments"} <= {f.rule_id for f in on_rtx.errors()}


def test_shipped_unit_maps_to_its_target_without_a_comment() -> None:
    (doc,) = load_file(BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "vllm-ml4.service")
    assert doc.target is not None and doc.target.name == "rtxpro6000-tp8"
    assert doc.engine.get("api-key") == "${VLLM_API_KEY}" and doc.env_files == ["/etc/vllm/ml4.env"]


# ------------------------------------------------------------------------------------------------ DGD

DGD_ALPHA = """
    apiVersion: nvidia.com/v1alpha1
    kind: DynamoGraphDeployment
    metadata: {name: alpha, namespace: ns1}
    spec:
      envs: [{name: DYN_PARSER_VERSION, value: "2"}]
      services:
        Frontend:
          componentType: frontend
          extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.frontend], args: [--migration-limit, "3"]}}
        Prefill:
          componentType: worker
          subComponentType: prefill
          extraPodSpec:
            mainContainer:
              command: [sh, -c]
              args: ["python3 -m dynamo.vllm --model /m --block-size 64 --kv-offloading-size 100"]
        Decode:
          componentType: worker
          extraPodSpec:
            mainContainer:
              command: [python3, -m, dynamo.vllm]
              args: [--model, /m, --disaggregation-mode, decode, --block-size, "64"]
    """


def test_v1alpha1_roles_and_shell_args(tmp_path: Path) -> None:
    (doc,) = load_file(write(tmp_path, "d.yaml", DGD_ALPHA))
    assert isinstance(doc, DgdDocument) and doc.api_version == "nvidia.com/v1alpha1" and doc.namespace == "ns1"
    roles = {c.name: c.role for c in doc.components}
    # Decode's role comes from --disaggregation-mode even though componentType is plain worker.
    assert roles == {"Frontend": "frontend", "Prefill": "prefill", "Decode": "decode"}
    assert doc.components[1].engine is not None and doc.components[1].engine.has("kv-offloading-size")
    assert doc.components[0].env["DYN_PARSER_VERSION"] == "2"
    hits = rules_hit(write(tmp_path, "d.yaml", DGD_ALPHA))
    assert "disagg-kv-connector" in hits and "migration-limit" not in hits


def test_name_prefix_respects_namespaces(tmp_path: Path) -> None:
    def dgd(name: str, ns: str | None) -> str:
        meta = f"{{name: {name}, namespace: {ns}}}" if ns else f"{{name: {name}}}"
        return f"apiVersion: nvidia.com/v1beta1\nkind: DynamoGraphDeployment\nmetadata: {meta}\nspec: {{components: []}}\n"
    a = write(tmp_path, "a.yaml", dgd("ml4", "team-a") + "---\n" + dgd("ml4-b", "team-b"))
    assert "dgd-name-prefix" not in rules_hit(a)
    b = write(tmp_path, "a.yaml", dgd("ml4", "team-a") + "---\n" + dgd("ml4-b", None))
    assert "dgd-name-prefix" in rules_hit(b)


def test_session_affinity_from_the_target(tmp_path: Path) -> None:
    # gb300-agg's clients send session ids (serving.session_affinity: true): a frontend without TTL fails.
    text = (BUNDLED_TARGETS_DIR / "gb300-agg" / "deploy.yaml").read_text()
    p = write(tmp_path, "d.yaml", text.replace('"3600"', '"0"'))
    report = lint_paths([p], load_target("gb300-agg"))
    assert any("outside 1..31536000" in f.message for f in report.by_rule("session-affinity-ttl"))
    assert not lint_paths([p], load_target("vr200-agg")).by_rule("session-affinity-ttl")


def test_vr200_agg_needs_no_nixl_settings_and_accepts_env_switch(tmp_path: Path) -> None:
    text = (BUNDLED_TARGETS_DIR / "vr200-agg" / "deploy.yaml").read_text()
    p = write(tmp_path, "d.yaml", text.replace(', "disable_eagle_block_drop": true', ""))
    (f,) = lint_paths([p]).by_rule("vr200-stability")
    assert "disable_eagle_block_drop" in f.message and "NIXL" not in f.message.split("missing")[-1]
    fixed = text.replace(', "disable_eagle_block_drop": true', "").replace(
        "- name: VLLM_USE_BREAKABLE_CUDAGRAPH", "- {name: VLLM_DISABLE_EAGLE_BLOCK_DROP, value: '1'}\n"
        "                - name: VLLM_USE_BREAKABLE_CUDAGRAPH")
    assert not lint_paths([write(tmp_path, "d.yaml", fixed)]).by_rule("vr200-stability")


def test_synthetic_acceptance_on_one_disagg_role_also_mismatches(tmp_path: Path) -> None:
    text = (BUNDLED_TARGETS_DIR / "gb300-disagg" / "deploy.yaml").read_text()
    first = '{"method": "dspark", "num_speculative_tokens": 3}'
    synthetic = text.replace(first, '{"method": "dspark", "num_speculative_tokens": 3, "synthetic_acceptance_rate": 0.6}', 1)
    hits = {f.rule_id for f in lint_paths([write(tmp_path, "deploy.yaml", synthetic)]).errors()}
    assert {"spec-synthetic-acceptance", "disagg-role-mismatch"} <= hits


# ------------------------------------------------------------------------------------------------ LiteLLM


@pytest.mark.parametrize("body, error, warning", [
    ("model_list: [{model_name: ml4, litellm_params: {model: x, max_retries: 0}}]\n", False, True),
    ("model_list: [{model_name: ml4, litellm_params: {model: x}}]\nrouter_settings: {num_retries: 0}\n", True, False),
    ("model_list: [{model_name: ml4, litellm_params: {model: x, num_retries: 0}}]\n", True, False),
    (("model_list: [{model_name: ml4, litellm_params: {model: x, max_retries: 0}}]\n"
      "litellm_settings: {num_retries: 3}\n"), False, False),
])
def test_litellm_retries(tmp_path: Path, body: str, error: bool, warning: bool) -> None:
    p = write(tmp_path, "l.yaml", body)
    assert ("proxy-retries-off" in rules_hit(p)) is error
    assert ("proxy-retries-off" in rules_hit(p, Severity.WARNING)) is warning


def test_litellm_retries_differ_from_target(tmp_path: Path) -> None:
    p = write(tmp_path, "l.yaml", RTX + "model_list: [{model_name: ml4, litellm_params: {model: x}}]\n"
                                        "litellm_settings: {num_retries: 5}\n")
    assert "proxy-retries-off" in rules_hit(p, Severity.WARNING)


def test_litellm_literal_keys(tmp_path: Path) -> None:
    p = write(tmp_path, "l.yaml", """
        model_list: [{model_name: ml4, litellm_params: {model: x, api_key: dummy-but-literal}}]
        litellm_settings: {num_retries: 2, max_input_tokens: 100}
        general_settings: {master_key: os.environ/LITELLM_MASTER_KEY}
        """)
    report = lint_paths([p])
    (f,) = report.by_rule("literal-secret")
    assert "api_key" in f.message and "dummy-but-literal" not in f.format()
    (doc,) = report.documents
    assert isinstance(doc, LiteLLMConfig) and "dummy-but-literal" not in repr(doc)


# ------------------------------------------------------------------------------------------------ aiperf


def test_aiperf_json_extra_inputs_scenario_and_default_dir(tmp_path: Path) -> None:
    p = write(tmp_path, "run.sh", """
        aiperf profile -m ml4 --url http://x --extra-inputs '{"ignore_eos": true, "min_tokens": 10}' --osl 10 \\
          --artifact-dir "/p/$(date +%s)"
        aiperf profile -m ml4 --url http://x --scenario inferencex-agentx-mvp
        """)
    report = lint_paths([p])
    ignore = report.by_rule("aiperf-ignore-eos")
    assert len(ignore) == 2 and any("scenario" in f.message for f in ignore)
    (reuse,) = report.by_rule("aiperf-artifact-dir-reuse")
    assert "no --artifact-dir" in reuse.message and reuse.line == 3
    assert not report.by_rule("aiperf-fixed-osl-min-tokens")


def test_aiperf_same_dir_twice_and_pod_name_fieldref(tmp_path: Path) -> None:
    job = """
        apiVersion: batch/v1
        kind: Job
        metadata: {name: j}
        spec:
          template:
            spec:
              containers:
                - name: a
                  env:
                    - name: POD
                      valueFrom: {fieldRef: {fieldPath: metadata.name}}
                  command: [bash, -c]
                  args:
                    - |
                      aiperf profile -m m --artifact-dir "/perf/$POD"
                      aiperf profile -m m --artifact-dir "/perf/$POD"
        """
    (doc,) = load_file(write(tmp_path, "j.yaml", job))
    assert isinstance(doc, PerfRun) and "POD" in doc.run_unique_vars and len(doc.invocations) == 2
    findings = lint_paths([tmp_path / "j.yaml"]).by_rule("aiperf-artifact-dir-reuse")
    assert len(findings) == 1 and "also used" in findings[0].message


def test_unreadable_yaml_is_a_parse_finding(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", "kind: DynamoGraphDeployment\nspec: [unclosed\n")
    assert "config-parse" in rules_hit(p)


def test_url_password_is_a_literal_secret(tmp_path: Path) -> None:
    p = write(tmp_path, "l.yaml", """
        model_list: [{model_name: ml4, litellm_params: {model: x}}]
        litellm_settings: {num_retries: 2}
        general_settings:
          database_url: postgresql://llm:pw-literal-123@db:5432/litellm
          alerting_url: postgresql://llm:${DB_PASSWORD}@db:5432/litellm
        """)
    report = lint_paths([p])
    (f,) = report.by_rule("literal-secret")
    assert "database_url" in f.message and "pw-literal-123" not in f.format() + repr(report.documents)


def test_drift_against_another_target() -> None:
    # The GB300 aggregated recipe checked against the disaggregated target: name, roles and flags differ.
    report = lint_paths([BUNDLED_TARGETS_DIR / "gb300-agg" / "deploy.yaml"], load_target("gb300-disagg"))
    text = " ".join(f.message for f in report.by_rule("target-manifest-drift"))
    assert "DGD name mistral-large-4-agg-gb300 vs control.dgd mistral-large-4-disagg-gb300" in text
    assert "--kv-offloading-size 200 vs None" in text


def test_unit_and_proxy_alias_drift(tmp_path: Path) -> None:
    unit = (BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "vllm-ml4.service").read_text()
    renamed = write(tmp_path, "vllm-other.service", RTX + unit)
    (f,) = lint_paths([renamed]).by_rule("target-manifest-drift")
    assert "unit file vllm-other.service vs target unit vllm-ml4.service" in f.message
    proxy = (BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "litellm.yaml").read_text()
    other = write(tmp_path, "litellm.yaml", RTX + proxy.replace("model_name: ml4", "model_name: ml4-beta"))
    (g,) = lint_paths([other]).by_rule("target-manifest-drift")
    assert "proxy.model_alias ml4" in g.message


def test_perf_job_drift_from_the_target_perf_section(tmp_path: Path) -> None:
    text = (BUNDLED_TARGETS_DIR / "gb300-agg" / "perf.yaml").read_text()
    p = write(tmp_path, "perf.yaml", text.replace('value: "16"}', 'value: "12"}').replace("3600 --bench", "600 --bench"))
    (f,) = lint_paths([p], load_target("gb300-agg")).by_rule("target-manifest-drift")
    assert "--concurrency 12 not in perf.concurrencies" in f.message
    assert "--benchmark-duration 600 vs perf.duration_s 3600" in f.message


def test_bash_c_in_exec_start_is_read(tmp_path: Path) -> None:
    unit = write(tmp_path, "vllm-ml4.service", RTX + """
        [Service]
        Environment=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        ExecStart=/bin/bash -lc 'source /opt/venv/bin/activate && exec vllm serve /m --gpu-memory-utilization 0.99'
        """)
    (doc,) = load_file(unit)
    assert isinstance(doc, VllmLaunch) and doc.engine.number("gpu-memory-utilization") == 0.99
    assert "rtx-util-startup-refused" in rules_hit(unit)
