"""The launcher: a function on N real ``torch.distributed`` ranks from a notebook cell, fast, loud, leaving nothing.

| module      | its one job                                                                                  |
|-------------|----------------------------------------------------------------------------------------------|
| launch      | the public API: ``launch``, ``prewarm``, ``run_as_student``, and the hook grading installs     |
| group       | one running group of ranks: rendezvous, pipes, supervision (used by ``launch`` and ``magic``) |
| events      | what ranks report: the ``Rank`` record, its states, the events its pipes become              |
| zygote      | the warm fork server (on a network of the ranks' own: ``lab_utils.netns``), its protocol       |
| worker      | what a rank process runs (one job, or cells for ``%%distributed``), and a launch's rendezvous  |
| diagnostics | a failure in words a student can act on (root-cause rank, collective, cell line)              |
| magic       | ``%dist`` / ``%%distributed`` / ``%%rank``: persistent ranks                                    |
| backend     | gloo or NCCL, threads per rank, loopback: decided without touching CUDA                        |
| doctor      | ``dtlabs doctor``: what a launch would use here, and a real 2-rank all-reduce                  |
| kernel_channels | the Jupyter server extension that starts student kernels on private Unix sockets         |
| relay       | ``Traffic``: a process group whose every message is counted in the launching process          |
| wire        | length-prefixed frames over pipes and sockets                                                  |
| plaindata   | values that cross between processes as plain data, decoded without trusting the sender        |

Nothing here imports ``lab_utils.grading`` or ``lab_utils.labkit``.
"""
