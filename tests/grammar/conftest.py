"""Grammar-test fixtures: the SmolLM2 tokenizer and the three backends, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok():
    from radixgen.runtime.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def xgr_backend(tok):
    from radixgen.grammar.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(tok)


@pytest.fixture(scope="session")
def outlines_backend(tok):
    from radixgen.grammar.outlines_backend import OutlinesBackend

    return OutlinesBackend(tok)


@pytest.fixture(scope="session")
def llg_backend(tok):
    from radixgen.grammar.llguidance_backend import LLGuidanceBackend

    return LLGuidanceBackend(tok)


@pytest.fixture(scope="session", params=["llguidance", "xgrammar", "outlines"])
def backend(request, llg_backend, xgr_backend, outlines_backend):
    """Each backend in turn (for behaviour all must share)."""
    return {"llguidance": llg_backend, "xgrammar": xgr_backend, "outlines": outlines_backend}[request.param]
