"""``ml4-target`` (``python -m pytest_ml4.discover``): write a target file for a running deployment.

    ml4-target new NAME --endpoint URL [--api-key-env VAR] --hardware FAMILY --gpus N [--gpu NAME]
                        [--log-file PATH] [--unit UNIT [--ssh-host-env VAR]] [--dgd NAME --namespace NS]
                        [--metrics-url URL [--litellm-config PATH]] [--dynamo-version TAG] [--model NAME]
                        [--out DIR] [--force]

Exit codes: 0 written, 2 bad input or the deployment could not be read (one line on stderr naming the URL,
variable, file or option). The API key is read from the variable ``--api-key-env`` names and never printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pytest_ml4.discover.probe import DiscoverError
from pytest_ml4.discover.write import NewTarget, new_target

PROG = "ml4-target"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Write a target file for a running deployment.")
    sub = p.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="write DIR/NAME.yaml from what the deployment at --endpoint shows")
    new.add_argument("name", metavar="NAME", help="the target's name (the file is OUT/NAME.yaml)")
    new.add_argument("--endpoint", required=True, metavar="URL", help="the OpenAI-compatible base URL, ending in /v1")
    new.add_argument("--api-key-env", metavar="VAR", help="the environment variable holding the API key")
    new.add_argument("--hardware", required=True, metavar="FAMILY", help="GPU family, e.g. h200, gb200, gb300")
    new.add_argument("--gpus", required=True, type=int, metavar="N", help="GPUs the deployment runs on, in all")
    new.add_argument("--gpu", metavar="NAME", help='the GPU model, e.g. "NVIDIA H200"')
    new.add_argument("--gpu-memory-gib", type=float, metavar="GIB", help="memory per GPU (a family not known)")
    new.add_argument("--bandwidth-tb-s", type=float, metavar="TBS", help="memory bandwidth per GPU, TB/s")
    new.add_argument("--metrics-url", metavar="URL", help="an engine's /metrics, when --endpoint is a proxy")
    new.add_argument("--litellm-config", metavar="PATH", help="the LiteLLM proxy's config, when --endpoint is the "
                     "proxy (needs --metrics-url)")
    new.add_argument("--log-file", metavar="PATH", help="the engine's log: its 'non-default args' line")
    new.add_argument("--unit", metavar="UNIT", help="the engine's systemd unit (logs from journald, restarts)")
    new.add_argument("--ssh-host-env", metavar="VAR", help="variable naming the host the unit runs on (ssh)")
    new.add_argument("--dgd", metavar="NAME", help="the DynamoGraphDeployment (logs and restarts via Kubernetes)")
    new.add_argument("--namespace", metavar="NS", help="the DGD's namespace")
    new.add_argument("--dynamo-version", metavar="TAG", help="the Dynamo release the deployment runs")
    new.add_argument("--model", metavar="NAME", help="the served model to describe when /v1/models lists several")
    new.add_argument("--out", default="targets", metavar="DIR", help="folder to write into (default: targets)")
    new.add_argument("--force", action="store_true", help="overwrite an existing file")
    return p


def _request(ns: argparse.Namespace) -> NewTarget:
    if ns.gpus < 1:
        raise DiscoverError(f"--gpus {ns.gpus}: must be at least 1")
    if bool(ns.namespace) != bool(ns.dgd):
        raise DiscoverError("--dgd and --namespace go together (the DynamoGraphDeployment and its namespace)")
    if ns.litellm_config and not ns.metrics_url:
        raise DiscoverError("--litellm-config needs --metrics-url (the engine's /metrics behind the proxy: its "
                            "server also answers /v1/models and /version)")
    if ns.ssh_host_env and not ns.unit:
        raise DiscoverError("--ssh-host-env needs --unit (the systemd unit on that host)")
    return NewTarget(name=ns.name, endpoint=ns.endpoint, hardware=ns.hardware.lower(), gpus=ns.gpus,
                     api_key_env=ns.api_key_env, gpu=ns.gpu, gpu_memory_gib=ns.gpu_memory_gib,
                     bandwidth_tb_s=ns.bandwidth_tb_s, metrics_url=ns.metrics_url,
                     litellm_config=ns.litellm_config, log_file=ns.log_file,
                     unit=ns.unit, ssh_host_env=ns.ssh_host_env, dgd=ns.dgd, namespace=ns.namespace,
                     dynamo_version=ns.dynamo_version, model=ns.model, out=ns.out, force=ns.force)


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        written = new_target(_request(ns))
    except DiscoverError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written.path} (valid target)")
    if written.undiscovered:
        print("not discovered (estimates in the file; set them before a gate run):")
        for line in written.undiscovered:
            print(f"  - {line}")
    return 0
