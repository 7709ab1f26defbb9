"""What the labs share: checks that explain a failure, synthetic data and models, cost models, widgets, torchrun.

| module    | its one job                                                                                 |
|-----------|---------------------------------------------------------------------------------------------|
| checks    | assertions that say which rank, which parameter, by how much, and the likely mistake        |
| data      | synthetic data sets (nothing is downloaded)                                                 |
| models    | tiny models: MLPs and a small transformer                                                   |
| costmodel | the alpha-beta cost of ring and tree all-reduce, and of a DDP step                          |
| widgets   | the ipywidgets explorer of the cost model (Lab 06)                                           |
| torchrun  | N torchrun agents on this machine as N "nodes" (Lab 05), reaped when they are done          |
| kernelmode | Lab 11's kernels compiled on a CUDA GPU, else Triton's interpreter and numba's simulator (no import of either) |
| locks     | ``CountedLock``: a lock served by the test's process, every acquisition and its process recorded there (Lab 09) |

May import ``lab_utils.launcher``; never ``lab_utils.grading``.
"""
