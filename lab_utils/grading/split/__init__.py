"""Split execution: a submission's cells run in a sandboxed *subject* process, the tests in the grader's kernel.

| module   | its one job                                                                                     |
|----------|-------------------------------------------------------------------------------------------------|
| execute  | ``SplitExecute``: nbgrader's Execute with every cell routed (grader, shared, student)            |
| proxy    | the grader's side: starts the subject, student definitions as proxies, ``launch`` through it     |
| subject  | the student's side: runs their cells in an IPython shell, answers only in plain data             |
| kernels  | Jupyter kernels on private Unix sockets (no port race under load)                                |
"""
