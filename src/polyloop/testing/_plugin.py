"""pytest plugin entry point of polyloop (``[project.entry-points.pytest11]``).

Its only job is to exist. At startup, before it imports any plugin, pytest looks at every
installed distribution that declares a ``pytest11`` entry point and marks that
distribution's top-level packages for assertion rewriting. Declaring this entry point is
therefore what makes pytest rewrite the ``assert`` statements in ``polyloop.testing``, whose
modules are not test files by pytest's naming rules. Without it a failing contract test shows
a bare ``AssertionError`` with neither side of the comparison.

Deleting this module, or the entry point, breaks nothing visibly; failure output just gets
worse. Hence the rules:

* It contains no code. Calling ``pytest.register_assert_rewrite`` here would be too late:
  importing this module first imports its parent package ``polyloop.testing``, and with it
  every contract module.
* It imports nothing (pytest and the standard library at most, if that ever changes), so
  that loading it cannot pull a store, the session or the HTTP adapter into every pytest run
  of every project that has polyloop installed.
* It does not touch the event loop; the loop belongs to the downstream project.

When plugin autoloading is disabled (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``), nothing marks
the package; the documented fallback is a
``pytest.register_assert_rewrite("polyloop.testing")`` line at the top of the downstream's
root ``conftest.py``.
"""
