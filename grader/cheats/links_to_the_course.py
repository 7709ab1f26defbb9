# attack: symbolic links beside the notebook: to the lab's solution (hidden tests and all), to another student's submission, and to the folder above the course (a copy that follows it recurses until the disk is full); the answer cell runs the solution it reads through them
# defended-by: files
# links: solution.ipynb -> ../../../../../solutions/01_ddp_setup/01_ddp_setup.ipynb; victim.ipynb -> ../../zz_victim/01_ddp_setup/01_ddp_setup.ipynb; course -> ../../../../../..
import json as _json
import os as _os

for _name in ("solution.ipynb", "victim.ipynb"):
    try:
        with open(_name) as _fh:
            _nb = _json.load(_fh)
    except (OSError, ValueError) as _exc:
        print(_name, "cannot be read:", type(_exc).__name__)
        continue
    for _cell in _nb["cells"]:
        _src = "".join(_cell["source"])
        if _cell["cell_type"] == "code" and "### BEGIN SOLUTION" in _src:
            exec(_src)  # noqa: S102 - the solution's answers, replacing the honest ones
    print(_name, "read and run")
print("the folder above the course is", "visible" if _os.path.isdir("course") else "not here")
