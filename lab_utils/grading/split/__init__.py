"""Split execution: a submission's cells run in a sandboxed *subject* process, the tests in the grader's kernel.

| module   | its one job                                                                                    |
|----------|------------------------------------------------------------------------------------------------|
| execute  | ``SplitExecute``: nbgrader's Execute with every cell routed (grader, shared, student)          |
| proxy    | the grader's side: ``start_grading``/``stop_grading``, the kernel's one ``GradingSession``     |
| session  | ``GradingSession``: the kernel prepared, the subject started, what the cells remember          |
| channel  | the subject process seen from the grader: one request at a time, output streamed, its end      |
| students | ``StudentProxy``, ``StudentValue``, ``GraderRemote``: student definitions seen from the grader |
| hooks    | ``%%student`` and the before/after-cell hooks of the grader kernel                             |
| crossing | pure functions: a reply into an exception, objects pickled for the subject, a death's reason   |
| subject  | the student's side: runs their cells in an IPython shell, answers only in plain data           |
| kernels  | Jupyter kernels on private Unix sockets (no port race under load)                              |
| provisioner | grader kernels forked from a warm server (``lab_utils.warm``) where one can run, else cold   |
"""
