"""pytest plugin: turns on assertion rewriting for the contract suite. Imports only pytest."""

import pytest

pytest.register_assert_rewrite("polyloop.testing")
