"""``python -m pytest_ml4.discover new NAME ...``: the ``ml4-target`` command without its console script."""

from pytest_ml4.discover.cli import main

raise SystemExit(main())
