"""radixgen/common/exit_hooks.py: stages in order, weak hooks, cancelling, a failing hook not stopping
the rest (the process-level behaviour is tests/e2e/test_clean_exit.py)."""

from __future__ import annotations

import gc

import pytest

from radixgen.common import exit_hooks
from radixgen.common.exit_hooks import COMPILERS, ENGINES, PROGRAMS, at_exit


@pytest.fixture
def hooks(monkeypatch):
    """A fresh hook table, so the process's own hooks (engines of other tests) are left alone."""
    monkeypatch.setattr(exit_hooks, "_hooks", {})
    return exit_hooks


class Owner:
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def close(self) -> None:
        self.calls.append(self.name)


def test_stages_run_in_order_latest_first_within_a_stage(hooks):
    calls: list[str] = []
    at_exit(lambda: calls.append("compiler"), COMPILERS)
    at_exit(lambda: calls.append("engine 1"), ENGINES)
    at_exit(lambda: calls.append("programs"), PROGRAMS)
    at_exit(lambda: calls.append("engine 2"), ENGINES)
    hooks.run_exit_hooks()
    assert calls == ["programs", "engine 2", "engine 1", "compiler"]
    hooks.run_exit_hooks()  # each hook runs once
    assert len(calls) == 4


def test_cancel_weak_and_failing_hooks(hooks):
    calls: list[str] = []
    cancel = at_exit(lambda: calls.append("cancelled"), ENGINES)
    cancel()
    cancel()  # idempotent
    kept, dropped = Owner(calls, "kept"), Owner(calls, "collected")
    at_exit(kept.close, ENGINES, weak=True)
    at_exit(dropped.close, ENGINES, weak=True)
    del dropped
    gc.collect()
    at_exit(lambda: 1 / 0, PROGRAMS)  # logged; the later hooks still run
    hooks.run_exit_hooks()
    assert calls == ["kept"]
