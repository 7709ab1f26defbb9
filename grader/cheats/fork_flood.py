# attack: start hundreds of processes
# defended-by: limits
import subprocess

_procs = [subprocess.Popen(["sleep", "300"]) for _ in range(400)]
