"""``python -m pytest_ml4.sim``: the simulated engine's server, as the README documented it before the server's
command line moved to :mod:`pytest_ml4.deploy.sim_cli` (the ``ml4-sim`` command). Kept so a user's scripts work."""

from pytest_ml4.deploy.sim_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
