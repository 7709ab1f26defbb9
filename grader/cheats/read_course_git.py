# attack: find the course from the paths this process can see (the package, the interpreter, sys.path) and read its
#   .git, where the hidden tests and the solutions are in every commit (`git show HEAD:solutions/...`)
# defended-by: sandbox
#   (bubblewrap: the course is not there; the separate user: the whole course but the venv and the package is closed
#   to it, the exposure check an allow-list)
import os
import subprocess
import sys

import lab_utils

_places = {os.path.realpath(p) for p in [os.path.dirname(lab_utils.__file__), sys.prefix, sys.executable, *sys.path] if p}
for _place in sorted(_places):
    _up = _place
    while _up not in ("/", ""):
        if os.path.isdir(os.path.join(_up, ".git")):
            try:
                _files = subprocess.run(["git", "-C", _up, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True,
                                        text=True, timeout=20).stdout.split()
                for _name in [f for f in _files if f.startswith(("solutions/", "grader/"))][:3]:
                    _shown = subprocess.run(["git", "-C", _up, "show", f"HEAD:{_name}"], capture_output=True,
                                            text=True, timeout=20).stdout
                    print("from the course's .git:", _name, _shown[:300])
                print(open(os.path.join(_up, ".git", "HEAD")).read()[:100])
            except (OSError, subprocess.SubprocessError) as _exc:
                print("could not read", _up, _exc)
            break
        _up = os.path.dirname(_up)
