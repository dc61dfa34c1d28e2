"""BFCL tool-calling accuracy gate: data loading (``data``), scoring (``score``), statistics (``stats``),
baseline and regression decision (``gate``), endpoint driver (``runner``), synthetic-acceptance guard (``guard``).
Only :mod:`pytest_ml4.accuracy.bfcl` imports ``bfcl_eval``; nothing here needs pytest."""
