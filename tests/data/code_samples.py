"""Test files in the formats of two code datasets, written for this project: BigCodeBench style (a
`task_func`, `class TestCases(unittest.TestCase)` with setUp, several assert methods, `unittest.main()`)
and KodCode style (pytest: `from solution import f`, `test_*` functions, `pytest.raises`,
parametrize). Each problem: (tests, correct solution, wrong solutions); the correct one must score 1.0,
every wrong one 0. Loaded by tests/test_rewards_code_mbpp.py."""

BIGCODEBENCH = {
    "word_counts": (
        '''
import unittest
from collections import Counter

class TestCases(unittest.TestCase):
    def setUp(self):
        self.text = "the cat and the hat and the bat"

    def test_counts(self):
        result = task_func(self.text)
        self.assertIsInstance(result, Counter)
        self.assertEqual(result["the"], 3)
        self.assertEqual(result["and"], 2)

    def test_empty(self):
        self.assertEqual(task_func(""), Counter())

    def test_case(self):
        self.assertEqual(task_func("A a A")["a"], 3)

if __name__ == "__main__":
    unittest.main()
''',
        "from collections import Counter\n\ndef task_func(text):\n    return Counter(text.lower().split())\n",
        ["def task_func(text):\n    return dict.fromkeys(text.split() + ['x'], 1)\n",
         "from collections import Counter\n\ndef task_func(text):\n    return Counter({'the': 3})\n"],
    ),
    "running_stats": (
        '''
import math
import unittest

class TestCases(unittest.TestCase):
    def test_mean_std(self):
        mean, std = task_func([1, 2, 3, 4])
        self.assertAlmostEqual(mean, 2.5)
        self.assertTrue(math.isclose(std, 1.118033988749895, rel_tol=1e-9))

    def test_single(self):
        self.assertEqual(task_func([5]), (5.0, 0.0))

    def test_empty_raises(self):
        with self.assertRaises(ValueError):
            task_func([])
''',
        "def task_func(xs):\n    if not xs:\n        raise ValueError('empty')\n    m = sum(xs) / len(xs)\n"
        "    return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5\n",
        ["def task_func(xs):\n    m = sum(xs) / len(xs)\n    return m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5\n",
         "def task_func(xs):\n    raise StopIteration\n"],
    ),
}

KODCODE = {
    "merge_intervals": (
        '''
import pytest
from solution import merge_intervals

def test_overlapping():
    assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]

def test_touching():
    assert merge_intervals([[1, 4], [4, 5]]) == [[1, 5]]

@pytest.mark.parametrize("intervals, expected", [([], []), ([[5, 7]], [[5, 7]]), ([[3, 4], [1, 2]], [[1, 2], [3, 4]])])
def test_edges(intervals, expected):
    assert merge_intervals(intervals) == expected

def test_bad_input():
    with pytest.raises(TypeError):
        merge_intervals(None)
''',
        "def merge_intervals(intervals):\n    out = []\n    for a, b in sorted(intervals):\n"
        "        if out and a <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], b)\n"
        "        else:\n            out.append([a, b])\n    return out\n",
        ["def merge_intervals(intervals):\n    return [[0, 0]]\n",
         "def merge_intervals(intervals):\n    return None\n"],
    ),
    "in_place_rotate": (
        '''
from solution import rotate

def test_rotate_in_place():
    nums = [1, 2, 3, 4, 5]
    assert rotate(nums, 2) is None
    assert nums == [4, 5, 1, 2, 3]

def test_rotate_more_than_length():
    nums = [1, 2]
    rotate(nums, 3)
    assert nums == [2, 1]
''',
        "def rotate(nums, k):\n    k %= len(nums)\n    nums[:] = nums[-k:] + nums[:-k]\n",
        ["def rotate(nums, k):\n    k %= len(nums)\n    return nums[-k:] + nums[:-k]\n",
         "def rotate(nums, k):\n    nums.append(0)\n"],
    ),
}
