"""Where the project's own tests find the checkout: its root, the recordings under ``fixtures/`` and ``suites/``.

The package finds its own data through :mod:`pytest_ml4.locations`; only the project's tests know a checkout.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "fixtures"
