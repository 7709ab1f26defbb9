"""Tests of the tests: proof that a lab's tests give full marks to its solution and take points from what is wrong.

| module  | its one job                                                                                  |
|---------|----------------------------------------------------------------------------------------------|
| build   | submissions built from the source: the solution filled in, one answer swapped             |
| swaps   | one grading session, many answers: the release, known-wrong answers and mutants swapped in    |
| mutate  | ``dtlabs mutate``: single-change mutants of the solutions, graded; survivors and kill rate     |
| stress  | ``dtlabs stress``: solutions graded (or tests run) K times with the other cores busy           |
"""
