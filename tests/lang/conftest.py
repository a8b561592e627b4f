"""The language backend over the session's shared real Engine (tests/conftest.py `engine`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def backend(engine):
    from radixgen.lang.backends.default import as_backend

    return as_backend(engine)


@pytest.fixture
def needs_constraints(backend):
    # the engine enforces constraints: a probe that comes back unconstrained is a regression, not a skip
    assert backend.supports_constraints(), "a regex-constrained probe came back unconstrained"
