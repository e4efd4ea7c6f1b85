"""Hypothesis profiles: `ci` (the default: every property, a moderate number of examples) and
`thorough` (20 times as many, for a change to the domain or a store, run by ./scripts/thorough).

Pick one with `--hypothesis-profile thorough` (or `H3_HYPOTHESIS_PROFILE`). A test whose examples
cost more or less than most states its count at the `ci` scale through `examples(n)`, which
scales with the loaded profile. No profile has a per-example deadline: that is a timed assertion,
and on a loaded 2-core machine it fails examples that are merely slow (time is measured by bench/).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 25

settings.register_profile(
    "ci",
    max_examples=CI_EXAMPLES,
    deadline=None,
    # The suite runs on busy machines: slow data generation is not a failure there.
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=20 * CI_EXAMPLES)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=5)
settings.load_profile(os.environ.get("H3_HYPOTHESIS_PROFILE", "ci"))


def examples(ci: int) -> int:
    """`ci` examples under the `ci` profile, scaled by the profile loaded (at least 1)."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)
