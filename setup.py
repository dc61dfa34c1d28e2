"""Packaging beyond what ``pyproject.toml`` can say: the checkout's ``suites/`` ships as ``pytest_ml4.suites``.

A platform team installs the suite with pip and runs it from its own repository; the suites it collects there
are these, found through the import system (``pytest_ml4.locations.suites_dir``: a wheel holds them at
``pytest_ml4/suites``, an editable install maps the name to ``suites/``). In a checkout they stay where the
project's tests and docs name them.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pytest_ml4", "pytest_ml4.*"]), "pytest_ml4.suites"],
    package_dir={"pytest_ml4.suites": "suites"},
)
