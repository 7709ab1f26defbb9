# attack: walk up from lab_utils.__file__ (the course checkout) to solutions/ and exec the instructor's answer
# defended-by: sandbox
import json
import pathlib

import lab_utils

for _up in pathlib.Path(lab_utils.__file__).resolve().parents:
    _path = _up / "solutions" / "01_ddp_setup" / "01_ddp_setup.ipynb"
    if _path.is_file():
        for _cell in json.loads(_path.read_text())["cells"]:
            if _cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
                exec("".join(_cell["source"]))
        break
else:
    print("no solutions/ above", lab_utils.__file__)
