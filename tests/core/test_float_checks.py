"""CI's second pass under other kernels runs the tests that compare floats, found in their
source (tests/float_checks.py): a tolerance or a tensor comparison, in the test or in a
function of the tests' own that it calls."""

from __future__ import annotations

import math

import pytest
from float_checks import compares_floats


def _near(a, b):
    assert abs(a - b).max() < 1e-5


def _through_a_helper():
    _near(1.0, 1.0)


def test_tolerances_and_tensor_comparisons_are_found():
    def approx():
        total = 0.1 + 0.2
        assert total == pytest.approx(0.3)

    def assert_close(torch):
        torch.testing.assert_close(torch.ones(2), torch.ones(2))

    def largest_difference(a, b):
        assert (a - b).abs().max().item() < 1e-5

    def isclose():
        assert math.isclose(0.1 + 0.2, 0.3)

    for function in (approx, assert_close, largest_difference, isclose):
        assert compares_floats(function), function.__name__


def test_a_helper_of_the_tests_that_compares_counts():
    assert compares_floats(_through_a_helper)


def test_what_compares_no_floats_is_left_out():
    def counts():
        assert [1, 2] == [1, 2] and len("ab") == 2

    def max_of_a_list():
        assert max([1, 2]) == 2

    assert not compares_floats(counts)
    assert not compares_floats(max_of_a_list)
