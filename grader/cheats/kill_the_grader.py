# attack: kill the parent process (the grader's kernel, where the subject is not sandboxed) to void grading
# defended-by: split, sandbox
import os
import signal

try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError as _exc:
    print("no parent to kill:", _exc)
