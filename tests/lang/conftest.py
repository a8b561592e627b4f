"""One real Engine (default SmolLM2-135M-Instruct) shared by the program tests of this package."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def engine():
    from radixgen.runtime.engine import Engine

    eng = Engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def backend(engine):
    from radixgen.lang.backends.base import as_backend

    return as_backend(engine)


@pytest.fixture
def needs_constraints(backend):
    if not backend.supports_constraints():
        pytest.skip("needs grammar constraints in the engine (a regex-constrained probe came back unconstrained)")
