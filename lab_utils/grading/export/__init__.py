"""Grades out of the grading machine, through each ecosystem's own interface: Gradescope, an LMS, the class report.

| module      | its one job                                                                                        |
|-------------|----------------------------------------------------------------------------------------------------|
| cells       | a lab's test cells, and each failing cell's message from an autograded notebook, hidden lines out   |
| gradescope  | ``dtlabs export gradescope``: the autograder zip (setup.sh, run_autograder, the lab, this package)  |
| autograder  | inside that zip: one submission graded as ``dtlabs grade`` would, written as results.json           |
| canvas      | ``CanvasExporter``, an nbgrader ExportPlugin: a CSV Canvas's gradebook import takes, by roster      |
| csvfile     | every CSV quoted and formula-safe; ``GradesCsvExporter``, the course's ``nbgrader export`` (grades) |
| late        | due dates from the course config into the gradebook, for nbgrader's late-submission plugin         |
| report      | ``dtlabs report``: what the class got wrong, as one HTML page with its plots                       |

``bundle/`` holds the zip's scripts. Nothing here imports at package import time: the grading pipeline imports
``late`` without the rest; each run's outcome is ``lab_utils.grading.outcomes``.
"""
