"""Fixtures the coordinator core's tests share."""

from __future__ import annotations

import pytest

from paramserver.coordinator.state import CoordinatorState
from ps_helpers import job_of


@pytest.fixture
def make():
    """Builds cores; every one of them must be consistent when the test ends."""
    made = []

    def build(resume_state=None, latest=None, **options):
        state = CoordinatorState(job_of(**options), resume_state, latest)
        made.append(state)
        return state

    yield build
    for state in made:
        state.check_invariants()
