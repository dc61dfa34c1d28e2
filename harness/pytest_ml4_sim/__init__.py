"""The embedded deployment of pytest-ml4 (``--sim``): the simulated engine, the launchers of the real LiteLLM proxy,
the real Dynamo frontend and its workers, real vLLM on the CPU, and the fake Kubernetes API.

A distribution of its own (``harness/``, ``pytest-ml4-sim``; the core's ``sim`` extra names it): a platform team's
live install (``pip install pytest-ml4``) carries none of it and the suites import none of it. The core plugin
imports it only when a run asks for ``--sim``.
"""

from importlib import resources
from pathlib import Path

#: The folder holding this package: what a child Python process (a Dynamo worker in Dynamo's own venv, real vLLM)
#: needs on ``PYTHONPATH`` beside the core's.
HARNESS_PARENT = Path(str(resources.files(__name__))).parent
