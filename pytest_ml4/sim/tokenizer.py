"""Re-export of :mod:`pytest_ml4.tokenizer` (the Tekken tokenizer moved to the core: checks and suites must not
import from ``pytest_ml4.sim``). Kept for simulator modules written against the old path."""

from pytest_ml4.tokenizer import *
from pytest_ml4.tokenizer import (  # noqa: F401 - private names some simulator modules use
    _clean_message,
    cache_dir,
    get_tokenizer,
    message_text,
    prompt_text_len,
    tekken_path,
)
