"""Repository-level pytest configuration.

The plugin itself is loaded through its ``pytest11`` entry point (``pytest_ml4.plugin``), so that an installed
pytest-ml4 behaves the same inside and outside this checkout. This file only keeps pytest from collecting the
folders that hold no tests: run outputs, benchmark scripts and CI/cluster examples.
"""

collect_ignore = ["reports", "benchmarks", "examples", "scripts", "node_modules"]
