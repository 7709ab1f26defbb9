# attack: import the grader's own modules and use them to write grades or read the hidden tests
# defended-by: sandbox
import lab_utils.grading as _grading
import lab_utils.grading.split.proxy as _proxy

print("session here:", _proxy._SESSION)
try:
    _root = _grading.REPO_ROOT
    print(_grading.cell_scores(_root, "01_ddp_setup", "victim"))
    _grading.register_students(_root, ["cheater"])
except Exception as _exc:  # noqa: BLE001
    print("grader modules reach nothing from here:", type(_exc).__name__, _exc)
