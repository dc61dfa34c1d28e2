"""Performance concern: the aiperf runner and its export readers, gates, baselines, roofline, plots and progress.

Core code only (no pytest import); ``pytest_ml4.plugin.perf`` is the pytest glue.
"""
