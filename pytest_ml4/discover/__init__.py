"""Writing a target for a running deployment from what it shows (``ml4-target new NAME``).

Core, no pytest::

    from pytest_ml4.discover import NewTarget, new_target
    written = new_target(NewTarget(name="mine", endpoint="http://10.0.0.5:8000/v1", api_key_env="LLM_API_KEY",
                                   hardware="h200", gpus=8))

``probe`` reads the deployment over HTTP, ``draft`` turns each answer into target fields with their source
(the tables in ``pytest_ml4/data/discover/``), ``write`` renders and validates the YAML, ``cli`` is the command.
"""

from pytest_ml4.discover.probe import DiscoverError
from pytest_ml4.discover.write import NewTarget, Written, new_target

__all__ = ["DiscoverError", "NewTarget", "Written", "new_target"]
