"""Start-up warm-up of `radixgen serve`: run the first request's paths once before accepting requests.

Without it the first request pays for the chat template's compilation, the first prefill and decode
steps (thread pools, kernel set-up) and the grammar backend's tokenizer tables (~1 s). The warm-up's
cache entries are flushed afterwards, so the first real request starts from an empty radix cache.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


def warm_up(engine: Any, state: Any) -> float:
    """Run a short chat request and a short regex-constrained one; returns the seconds it took."""
    t0 = time.perf_counter()
    prompt = "Hi"
    if getattr(engine.tokenizer, "chat_template", None):
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        state.template_uses_tools()
    engine.generate(prompt, {"max_new_tokens": 4, "temperature": 0})
    engine.generate("Hi", {"max_new_tokens": 2, "temperature": 0, "regex": "[0-9]+"})
    engine.flush_cache()
    seconds = time.perf_counter() - t0
    logger.info("warmed up in %.1f s (chat template, prefill + decode, grammar backend)", seconds)
    return seconds
