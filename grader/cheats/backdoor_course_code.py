# attack: append no-op checks to the course's lab_utils/labkit/checks.py, so every later student passes with wrong code
# defended-by: sandbox
import lab_utils.labkit.checks

try:
    with open(lab_utils.labkit.checks.__file__, "a") as _fh:
        _fh.write("\n\ndef assert_close(*a, **k):\n    return None\n\n\ndef assert_equal(*a, **k):\n    return None\n")
    print("backdoor written to", lab_utils.labkit.checks.__file__)
except OSError as _exc:
    print("course code is read-only:", _exc)
