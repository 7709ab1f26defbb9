# attack: start processes that try to outlive grading: new sessions, an empty environment, a double fork
# defended-by: sandbox
import os
import subprocess

for _ in range(3):
    subprocess.Popen(["sleep", "600"], env={}, start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "601"])
    os._exit(0)
