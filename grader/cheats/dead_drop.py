# attack: leave what this submission saw (here: its environment and its folder's listing) in every folder any user
#   may write, and print what an earlier submission left there: a later submission then shows it in its own feedback
# defended-by: sandbox
#   (bubblewrap: a private /tmp; the separate user: all it owns in a world-writable folder is removed after each
#   submission; unprotected: the grader's own user, not defended there but for the subject's private TMPDIR)
import os

_seen = f"{sorted(os.environ)} {os.listdir('.')}"
for _folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    _drop = os.path.join(_folder, ".dtlabs-dead-drop")
    try:
        with open(_drop) as _fh:
            print("an earlier submission left:", _fh.read()[:200])
    except OSError:
        pass
    try:
        with open(_drop, "w") as _fh:
            _fh.write(_seen)
    except OSError as _exc:
        print("could not leave a drop in", _folder, _exc)
