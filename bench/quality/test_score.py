#!/usr/bin/env python3
"""Checks of score.py's metrics and its case-by-case comparison (run by scripts/test.sh).

    python3 bench/quality/test_score.py
"""

import math
import unittest

import score


def case(cid, language, expected):
    return {"id": cid, "language": language, "expected": expected}


class Metrics(unittest.TestCase):
    def test_first_line_is_trimmed_at_the_right_only(self):
        self.assertEqual(score.first_line("  x = 1  \ny = 2"), "  x = 1")
        self.assertEqual(score.first_line("  x = 1\n", strip_leading=True), "x = 1")

    def test_edit_similarity(self):
        self.assertEqual(score.edit_similarity("", ""), 1.0)
        self.assertEqual(score.edit_similarity("abc", "abc"), 1.0)
        self.assertAlmostEqual(score.edit_similarity("abcd", "abed"), 0.75)
        self.assertEqual(score.edit_similarity("", "ab"), 0.0)
        # Code points, not bytes.
        self.assertAlmostEqual(score.edit_similarity("é", "e"), 0.0)


class Failures(unittest.TestCase):
    def test_only_answers_with_an_error_count(self):
        results = [{"id": "a", "output": ""}, {"id": "b", "output": "", "error": "mlx: boom"},
                   {"id": "c", "output": "x", "error": None}]
        self.assertEqual(score.failures(results), 1)


class SignTest(unittest.TestCase):
    def test_even_and_empty_splits_are_not_evidence(self):
        self.assertEqual(score.sign_test(0, 0), 1.0)
        self.assertEqual(score.sign_test(5, 5), 1.0)

    def test_matches_the_binomial_tail(self):
        # 2 * P(X <= 1) for X ~ Bin(10, 1/2) = 2 * 11 / 1024.
        self.assertAlmostEqual(score.sign_test(9, 1), 22 / 1024)
        self.assertAlmostEqual(score.sign_test(1, 9), 22 / 1024)
        self.assertLess(score.sign_test(40, 20), 0.05)
        self.assertGreater(score.sign_test(46, 49), 0.5)
        p = 2 * sum(math.comb(60, i) for i in range(21)) / 2 ** 60
        self.assertAlmostEqual(score.sign_test(40, 20), p)


class Versus(unittest.TestCase):
    cases = [case("p1", "python", "a"), case("p2", "python", "b"), case("p3", "python", "c"),
             case("r1", "rust", "x"), case("r2", "rust", "y")]

    def test_counts_one_sided_cases_per_language_and_overall(self):
        first = [{"id": "p1", "output": "a\nmore"}, {"id": "p2", "output": "no"},
                 {"id": "p3", "output": "c"}, {"id": "r1", "output": "x"}, {"id": "r2", "output": "y"}]
        other = [{"id": "p1", "output": "a"}, {"id": "p2", "output": "b"},
                 {"id": "p3", "output": "no"}, {"id": "r1", "output": "no"}, {"id": "r2", "output": "no"}]
        rows = {r[0]: r[1:] for r in score.versus(self.cases, first, other)}
        # (cases, exact first, exact other, only first, only other)
        self.assertEqual(rows["python"], (3, 2, 2, 1, 1))
        self.assertEqual(rows["rust"], (2, 2, 0, 2, 0))
        self.assertEqual(rows["all"], (5, 4, 2, 3, 1))
        self.assertEqual([r[0] for r in score.versus(self.cases, first, other)],
                         ["python", "rust", "all"])

    def test_only_cases_both_answered_count(self):
        first = [{"id": "p1", "output": "a"}, {"id": "r1", "output": "x"}]
        other = [{"id": "p1", "output": "a"}]
        rows = {r[0]: r[1:] for r in score.versus(self.cases, first, other)}
        self.assertEqual(rows, {"python": (1, 1, 1, 0, 0), "all": (1, 1, 1, 0, 0)})


class Bootstrap(unittest.TestCase):
    def setUp(self):
        # python: first right on 8 of 10, other on 4 (ratio 2.0); rust: both right on the same
        # 5 of 10 (ratio 1.0, in every resample).
        self.cases = [case(f"p{i}", "python", "x") for i in range(10)] + \
            [case(f"r{i}", "rust", "x") for i in range(10)]
        self.first = [{"id": f"p{i}", "output": "x" if i < 8 else "-"} for i in range(10)] + \
            [{"id": f"r{i}", "output": "x" if i < 5 else "-"} for i in range(10)]
        self.other = [{"id": f"p{i}", "output": "x" if i < 4 else "-"} for i in range(10)] + \
            [{"id": f"r{i}", "output": "x" if i < 5 else "-"} for i in range(10)]

    def test_identical_answers_never_reach_a_goal_above_one(self):
        out = score.bootstrap(self.cases, self.first, self.other, 400, 1.05)
        self.assertEqual(out["rust"], (1.0, 1.0, 0.0))
        self.assertEqual(out["every"][2], 0.0)

    def test_a_clear_lead_mostly_reaches_the_goal_and_the_interval_holds_the_ratio(self):
        out = score.bootstrap(self.cases, self.first, self.other, 400, 1.05)
        lo, hi, share = out["python"]
        self.assertLess(lo, 2.0)
        self.assertGreater(hi, 2.0)
        self.assertGreater(share, 0.9)
        self.assertEqual(out, score.bootstrap(self.cases, self.first, self.other, 400, 1.05),
                         "seeded")
        self.assertEqual(score.bootstrap(self.cases, self.first, self.other, 400, 1.0)["every"][2], 1.0)


class Rerank(unittest.TestCase):
    ALTS = [  # laya's order: best mean first
        {"text": "b = 2\n", "choice": 1, "tokens": 10, "logprob": -5.0},  # mean -0.5
        {"text": "a = 1", "choice": 0, "tokens": 2, "logprob": -2.0},     # mean -1.0, best sum
        {"text": "c = 3", "choice": 2, "tokens": 1, "logprob": -3.0},
    ]

    def pick(self, how, expected=None):
        results = [{"id": "x", "output": "b = 2\n", "alternatives": self.ALTS},
                   {"id": "y", "output": "plain"}]
        return [r["output"] for r in score.rerank(results, how, expected)]

    def test_rankings(self):
        self.assertEqual(self.pick("greedy"), ["a = 1", "plain"])
        self.assertEqual(self.pick("mean"), ["b = 2\n", "plain"])
        self.assertEqual(self.pick("sum"), ["a = 1", "plain"])

    def test_any_finds_the_expected_line_else_keeps_the_answer(self):
        self.assertEqual(self.pick("any", {"x": "c = 3"}), ["c = 3", "plain"])
        self.assertEqual(self.pick("any", {"x": "d = 4"}), ["b = 2\n", "plain"])

    def test_greedy_dropped_by_post_processing_is_an_empty_answer(self):
        results = [{"id": "x", "output": "b", "alternatives": [self.ALTS[0]]}]
        self.assertEqual(score.rerank(results, "greedy")[0]["output"], "")


if __name__ == "__main__":
    unittest.main()
