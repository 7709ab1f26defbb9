# attack: ship the files Python runs when it starts (sitecustomize.py, usercustomize.py) beside the notebook and in
#   .dtlabs_pkg/, the folder the private package once had on the subject's PYTHONPATH (with a torch.py there too):
#   they run before the subject enters its boundary, where a thread they start stays outside the Landlock domain
#   (Landlock binds the thread that enters it) and can trace, signal or listen to the grader's processes
# defended-by: sandbox
#   (the subject's interpreter starts isolated, -I, with the private package outside the submission's folder and
#   read-only to it, and outside bubblewrap it enters its Landlock domain between fork and exec: no file of the
#   submission runs before the boundary, and every thread it will have is bound. Each shipped file leaves the mark
#   the corpus test looks for wherever it runs at the subject's start)
# ships: shipped/shipped_startup_files
print("shipped sitecustomize.py, usercustomize.py and .dtlabs_pkg/ beside the notebook")
