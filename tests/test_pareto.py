"""Pareto fronts, hypervolume and the reference point on hand-made sets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cubic.pareto import (
    fronts,
    hypervolume,
    hypervolume_ratio,
    improvement_2d,
    non_dominated,
    oriented,
    reference_point,
)


def brute_front(p: np.ndarray) -> np.ndarray:
    out = []
    for i in range(len(p)):
        dominated = any(
            np.all(p[j] >= p[i]) and np.any(p[j] > p[i]) for j in range(len(p)) if j != i
        )
        out.append(not dominated)
    return np.array(out)


def test_front_of_a_hand_made_set() -> None:
    # (throughput, -memory): maximise both.
    pts = np.array(
        [
            [10.0, -5.0],  # fastest, most memory: on the front
            [8.0, -3.0],  # on the front
            [8.0, -4.0],  # dominated by the one above (same speed, more memory)
            [5.0, -1.0],  # leanest: on the front
            [4.0, -2.0],  # dominated by (5, -1)
            [8.0, -3.0],  # equal to a front point: equal points do not dominate each other
        ]
    )
    assert non_dominated(pts).tolist() == [True, True, False, True, False, True]
    assert fronts(pts).tolist() == [0, 0, 1, 0, 1, 0]


@pytest.mark.parametrize("m", [2, 3])
def test_front_matches_brute_force(m: int) -> None:
    rng = np.random.default_rng(m)
    pts = rng.integers(0, 6, size=(200, m)).astype(float)  # many ties
    assert (non_dominated(pts) == brute_front(pts)).all()


def test_oriented_negates_minimised_columns() -> None:
    v = oriented([[100.0, 40.0]], ["maximize", "minimize"])
    assert v.tolist() == [[100.0, -40.0]]


def test_hypervolume_known_cases() -> None:
    ref = [0.0, 0.0]
    assert hypervolume([[1.0, 1.0]], ref) == pytest.approx(1.0)
    # Two boxes 2x1 and 1x2 overlapping in a 1x1 square: 3.
    assert hypervolume([[2.0, 1.0], [1.0, 2.0]], ref) == pytest.approx(3.0)
    # A dominated point and a point behind the reference add nothing.
    assert hypervolume([[2.0, 1.0], [1.0, 2.0], [1.0, 1.0], [-1.0, 5.0]], ref) == pytest.approx(3.0)
    assert hypervolume(np.zeros((0, 2)), ref) == 0.0
    # 3-D: the unit cube plus a 2x1x1 box sharing it: 2; two disjoint-ish staircases.
    assert hypervolume([[1.0, 1.0, 1.0]], [0.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert hypervolume([[2.0, 1.0, 1.0], [1.0, 2.0, 1.0]], [0, 0, 0]) == pytest.approx(3.0)
    assert hypervolume([[2.0, 1.0, 1.0], [1.0, 1.0, 2.0], [1.0, 2.0, 1.0]], [0, 0, 0]) == (
        pytest.approx(4.0)
    )


def test_hypervolume_matches_a_grid_count() -> None:
    rng = np.random.default_rng(1)
    pts = rng.integers(1, 20, size=(15, 2)).astype(float)
    cells = sum(
        1
        for x, y in itertools.product(range(20), range(20))
        if np.any((pts[:, 0] >= x + 1) & (pts[:, 1] >= y + 1))
    )
    assert hypervolume(pts, [0.0, 0.0]) == pytest.approx(cells)


def test_improvement_is_the_hypervolume_gained() -> None:
    rng = np.random.default_rng(2)
    front = rng.random((6, 2))
    cand = rng.random((50, 2)) * 1.2
    ref = np.array([0.05, 0.05])
    base = hypervolume(front, ref)
    expected = [hypervolume(np.vstack([front, c]), ref) - base for c in cand]
    assert np.allclose(improvement_2d(cand, front, ref), expected)
    assert np.allclose(
        improvement_2d(cand, np.zeros((0, 2)), ref), [hypervolume([c], ref) for c in cand]
    )


def test_reference_point_rule() -> None:
    # nadir (1, 1), range (3, 3): the reference lies a tenth of the range beyond the nadir.
    ref = reference_point([[4.0, 1.0], [1.0, 4.0], [0.5, 0.5]])
    assert ref.tolist() == pytest.approx([0.7, 0.7])
    # One point: a tenth of its magnitude.
    assert reference_point([[10.0, -2.0]]).tolist() == pytest.approx([9.0, -2.2])


def test_ratio_is_one_for_the_true_front_and_less_for_part_of_it() -> None:
    true = np.array([[4.0, 1.0], [3.0, 2.0], [1.0, 4.0]])
    assert hypervolume_ratio(true, true) == pytest.approx(1.0)
    assert 0.0 < hypervolume_ratio(true[:2], true) < 1.0
    assert hypervolume_ratio(np.zeros((0, 2)), true) == 0.0
