"""Assertion rewriting for the flowlang test helpers, so their failures explain themselves
as they did when the checks lived in test modules."""

import pytest

pytest.register_assert_rewrite("tests.flowlang.render_checks", "tests.flowlang.generators")
