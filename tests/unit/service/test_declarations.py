"""The routes declare their parameters, dependencies and bodies in the form Litestar keeps in 3.0:
building the apps warns of no deprecation (pyproject's filterwarnings also turns Litestar's into
errors for the whole suite)."""

from __future__ import annotations

import warnings

from h3core.runtime.settings import Settings
from h3core.service.app import create_app, create_metrics_app


def test_building_the_apps_warns_of_no_deprecation(tmp_path):
    settings = Settings(
        db=tmp_path / "h3.db",
        artifacts=tmp_path / "artifacts",
        uploads=tmp_path / "uploads",
        executor="fake",
        api_tokens=["a-token-of-sixteen-chars-or-more"],  # the token guard and its routes too
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = create_app(settings)
        create_metrics_app(settings, app.state.service)
    app.state.service.store.close()
    assert [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, DeprecationWarning)] == []
