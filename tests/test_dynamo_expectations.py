"""The suites' Dynamo expectations (issue 12 items 6, 8; issue 14 items 2, 3), checked against the recorded real
Dynamo 1.6.1 answers in ../shared/reference/real-dynamo-1.6.1-transcripts/ and small scripted transports.

No simulator and no Dynamo process: every request goes through ``httpx.MockTransport``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.client import Endpoint, worker_metrics_urls_from_env
from pytest_ml4.dynamo_versions import behaviour, image_version, load_table
from pytest_ml4.targets import TargetError, load_target

DYNAMO_TARGETS = ("gb300-agg", "gb300-disagg", "vr200-agg", "vr200-disagg")


# ------------------------------------------------------------------------------------- versions and fields
def test_versions_table_rows_say_what_real_1_6_1_does() -> None:
    public = behaviour("1.6.1")
    assert public is not None and public.public
    # reference/real-dynamo.md: the v11 form is dropped, DYN_PARSER_VERSION=2 + mistral is never served.
    assert not public.mistral_v11_tool_calls_parsed and not public.mistral_parser_v2
    assert public.mistral_legacy_tool_calls_parsed
    assert behaviour("1.6.0") == public, "the 1.6.x row covers every public 1.6 release"
    seed = behaviour("1.7.0-mistral-large-4-dev.1")
    assert seed is not None and seed.mistral_v11_tool_calls_parsed and seed.mistral_parser_v2
    assert behaviour("0.1.0") is None


def test_versions_table_rejects_a_non_boolean(tmp_path: Path) -> None:
    bad = tmp_path / "versions.yaml"
    bad.write_text("versions:\n  '9.9':\n    public: yes-ish\n")
    with pytest.raises(ValueError, match=r"versions\.9\.9\.public"):
        load_table(bad)


@pytest.mark.parametrize("name", DYNAMO_TARGETS)
def test_dynamo_targets_state_the_image_version_of_their_manifests(name: str) -> None:
    target = load_target(name)
    images = set()
    for manifest in target.manifests:
        text = target.resolve(manifest).read_text()
        images |= {line.split("image:", 1)[1].strip() for line in text.splitlines() if "image:" in line
                   and "ai-dynamo" in line}
    assert images, f"{name}: no Dynamo image in its manifests"
    assert {image_version(i) for i in images} == {target.serving.dynamo_version}


def test_dynamo_version_is_required_and_known() -> None:
    with pytest.raises(TargetError, match="needs dynamo_version"):
        load_target("gb300-agg", overrides={"serving": {"dynamo_version": None}})
    with pytest.raises(TargetError, match=r"dynamo_version '9\.9' is not in fixtures/dynamo/versions\.yaml"):
        load_target("gb300-agg", overrides={"serving": {"dynamo_version": "9.9"}})
    with pytest.raises(TargetError, match="only for stack dynamo"):
        load_target("rtxpro6000-tp8", overrides={"serving": {"dynamo_version": "1.6.1"}})


def test_image_version() -> None:
    assert image_version("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1") == "1.6.1"
    assert image_version("registry:5000/vllm-runtime:1.7.0-x@sha256:abc") == "1.7.0-x"
    assert image_version("registry:5000/vllm-runtime") is None


def test_worker_metrics_urls_from_env() -> None:
    target = load_target("gb300-disagg")
    env = {"ML4_GB300_DISAGG_PREFILL_METRICS": "http://p0:9090/metrics, http://p1:9090/metrics",
           "ML4_GB300_DISAGG_DECODE_METRICS": ""}
    urls = worker_metrics_urls_from_env(target.endpoint.worker_metrics_url_env, env)
    assert urls == {"prefill": ("http://p0:9090/metrics", "http://p1:9090/metrics")}
    ep = Endpoint("http://fe:8000/v1", worker_metrics_urls=urls)
    assert ep.all_worker_metrics_urls() == urls["prefill"]
    with pytest.raises(TargetError, match="worker_metrics_url_env"):
        load_target("gb300-agg", overrides={"endpoint": {"worker_metrics_url_env": {"frontend": "X"}}})
