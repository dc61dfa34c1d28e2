"""Packaging beyond what ``pyproject.toml`` can say: the checkout's ``suites/`` ships as ``pytest_ml4.suites``.

A platform team installs the suite with pip and runs it from its own repository; the suites it collects there
are these (``pytest_ml4.plugin_args``). In a checkout they stay where the project's tests and docs name them.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pytest_ml4", "pytest_ml4.*"]), "pytest_ml4.suites"],
    package_dir={"pytest_ml4.suites": "suites"},
)
