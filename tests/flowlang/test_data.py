"""The data rules of FLOWLANG.md §7 as pure functions."""

import pytest

from flowlang.data import DataError, gather, guard_matches, merge


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([{}], {}),
        ([[]], []),
        ([{"a": 1}], {"a": 1}),
        ([{}, {}], {}),
        ([{}, {"a": 1}], {"a": 1}),
        ([{"a": 1}, {}, {"b": 2}], [{"a": 1}, {"b": 2}]),
        ([[], {}], []),
        ([[], []], [[], []]),
        ([{"a": 1}, [1]], [{"a": 1}, [1]]),
    ],
)
def test_gather_collapses_empty_objects_but_never_empty_lists(
    values: list, expected: object
) -> None:
    assert gather(values) == expected


def test_merge_joins_objects_later_keys_winning_and_passes_a_single_object() -> None:
    assert merge([{"a": 1, "b": 1}, {"b": 2}]) == {"a": 1, "b": 2}
    assert merge({"a": 1}) == {"a": 1}
    assert merge([]) == {}


@pytest.mark.parametrize("value", [[{"a": 1}, [1]], [1], "text", None])
def test_merge_rejects_items_that_are_not_objects(value: object) -> None:
    with pytest.raises(DataError, match="cannot merge"):
        merge(value)


@pytest.mark.parametrize(
    ("guard", "value", "matches"),
    [
        ("$[?(@.status=0)]", {"status": 0}, True),
        ("$[?(@.status=0)]", {"status": 1}, False),
        ("$[?(@.status=0)]", [{"status": 1}, {"status": 0}], True),
        ("$[?(@.status=0)]", [{"status": 1}], False),
        ("$[?(@.status>1)]", {"status": 2}, True),
        ("$.status", {"status": 0}, True),
        ("$.status", {"other": 0}, False),
        ("$.items[0]", {"items": [5]}, True),
        ("$.items[0]", {"items": []}, False),
    ],
)
def test_guard_matches_when_the_path_finds_a_value(
    guard: str, value: object, matches: bool
) -> None:
    assert guard_matches(guard, value) is matches
