"""Unix sockets the course's processes listen on and connect to, made with the mode that says who may reach them
and never through a path a link could redirect: the relay and counted locks (the launcher, the labs), the warm
servers (grading). Stdlib only: the zygote imports it before torch."""
from __future__ import annotations

import os
import socket
import stat
import tempfile

SOCKETS_VAR = "DTLABS_SOCKETS"  # while grading: the folder for sockets the grader makes and the subject reaches


def _unix_call(sock, method: str, path: str) -> None:
    """``sock.bind`` or ``sock.connect`` to a Unix socket at ``path``, through /proc/self/fd when the path is longer
    than a socket address holds (108 bytes: a course or pytest folder deep under /tmp)."""
    if len(path.encode()) < 100:
        getattr(sock, method)(path)
        return
    fd = os.open(os.path.dirname(path), os.O_PATH)
    try:
        getattr(sock, method)(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)


def listen_unix(path: str, backlog: int = 64, mode: int = 0o600, kind: int | None = None):
    """A Unix stream socket listening at ``path`` with ``mode`` (default: this user only). The mode is set on the
    socket before it is bound (Linux creates the file with the socket's mode less the umask), never by a ``chmod``
    of the path afterwards, which would follow a link put there in between. Raises if the file made is not a
    socket with exactly ``mode`` (a umask that took a bit the caller needs). ``kind``: a stream socket by default."""
    srv = socket.socket(socket.AF_UNIX, kind or socket.SOCK_STREAM)
    try:
        os.fchmod(srv.fileno(), mode)
        _unix_call(srv, "bind", path)
        made = os.lstat(path)
        if not stat.S_ISSOCK(made.st_mode) or stat.S_IMODE(made.st_mode) != mode:
            raise PermissionError(f"{path}: the socket was made with mode {oct(stat.S_IMODE(made.st_mode))}, not "
                                  f"{oct(mode)} (the process's umask takes bits it needs)")
        srv.listen(backlog)
    except BaseException:
        srv.close()
        raise
    return srv


def socket_folder() -> str:
    """Where a listener the ranks reach is made by default: under grading, the folder the grader made for the
    subject's sockets, which the subject can enter but not write (no link or socket of its own can stand in for
    ours); elsewhere the temp folder."""
    return os.environ.get(SOCKETS_VAR) or tempfile.gettempdir()


def socket_mode(folder: str) -> int:
    """The mode for a socket in ``folder``: a setgid folder is shared with its group (the grading subject's, where
    the subject is another user: ``sandbox.sockets_folder``), so its sockets are 0660; anywhere else 0600."""
    return 0o660 if os.stat(folder).st_mode & stat.S_ISGID else 0o600


def connect_unix(path: str, kind: int | None = None):
    """A Unix socket (``kind``: a stream socket by default) connected to ``path``."""
    sock = socket.socket(socket.AF_UNIX, kind or socket.SOCK_STREAM)
    try:
        _unix_call(sock, "connect", path)
    except BaseException:
        sock.close()
        raise
    return sock


def close_unix(path: str, *socks) -> None:
    """Shut down and close ``socks`` (a listener and its connections) and remove the socket file at ``path``."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
    try:
        os.unlink(path)
    except OSError:
        pass
