"""The language backend over the session's shared real Engine (tests/conftest.py `engine`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def backend(engine):
    from radixgen.lang.backends.base import as_backend

    return as_backend(engine)


@pytest.fixture
def needs_constraints(backend):
    if not backend.supports_constraints():
        pytest.skip("needs grammar constraints in the engine (a regex-constrained probe came back unconstrained)")
