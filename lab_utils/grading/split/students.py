"""What a submission's definitions become in the grader kernel: ``StudentProxy`` (a callable, run over there),
``StudentValue`` (a value that is not plain data), and ``GraderRemote``, which sends ``launch``/``run_as_student``
over there. Each reaches the subject through the ``GradingSession`` it was made for."""
from __future__ import annotations

from lab_utils.grading.split import crossing


class StudentProxy:
    """Stands in, in the grader, for a callable the student defined (``lab_utils.grading.split.proxy``)."""

    def __init__(self, name: str, kind: str, session):
        self.__name__ = self.__qualname__ = name
        self._kind = kind
        self._session = session

    def __call__(self, *args, **kwargs):
        payload = self._session.dumps((args, kwargs))
        return self._session.call({"op": "call", "name": self.__name__, "payload": payload})

    def __reduce__(self):
        from lab_utils.grading.split import subject

        return subject.resolve, (self.__name__,)

    def __repr__(self):
        return f"<student {self._kind} {self.__name__}>"

    def __getattr__(self, attr):
        raise AttributeError(
            f"the test tried to use {self.__name__}.{attr}, but {self.__name__} is the student's {self._kind}, which "
            "lives in the student's process: use it inside a harness run with run_as_student() or launch()")


class StudentValue:
    """A value a student cell bound that is not plain data: using it says why instead of failing obscurely."""

    def __init__(self, name: str, type_name: str, session):
        self.__name__ = name
        self._type_name = type_name
        self._session = session

    def __getattr__(self, attr):
        # its type's name is the student's to choose: not shown once hidden tests have run
        what = "a value" if self._session.hidden else f"a {self._type_name}"
        raise TypeError(f"{self.__name__} is {what} in the student's process; the grader sees only "
                        "plain data: use it inside a harness run with run_as_student() or launch()")

    def __repr__(self):
        return f"<student value {self.__name__}: {self._type_name}>"


class GraderRemote:
    """What ``launch`` and ``run_as_student`` do in the grader kernel while grading (``launcher.launch.set_remote``):
    the work goes to the student's process, as plain data and names, and only plain data comes back."""

    def __init__(self, session):
        self.session = session

    def run(self, fn, args, kwargs):
        payload = self.session.dumps((fn, args, kwargs))
        return self.session.call({"op": "run", "payload": payload})

    def launch(self, fn, world_size, backend, timeout, args, kwargs, *, debug=False, quiet=False, traffic=None):
        """The subject's launcher starts the ranks inside the sandbox. With ``traffic``, the relay that counts
        their messages runs here, in the grader, listening in the folder made for the subject's sockets, which the
        subject can enter but not write (``sandbox.sockets_folder``)."""
        from lab_utils.launcher.group import validate

        validate(fn, world_size, timeout)
        subject = self.session.running()
        payload = self.session.dumps((fn, tuple(args), dict(kwargs or {})))
        options = {"world_size": world_size, "backend": backend, "timeout": timeout, "debug": debug, "quiet": quiet}
        relay = traffic.start(world_size, directory=str(subject.sockets)) if traffic is not None else None
        if relay is not None:
            options["relay"] = relay.address
        try:
            reply = subject.request({"op": "launch", "payload": payload, "options": options})
        finally:
            if relay is not None:
                relay.stop()
        if not reply.get("ok"):
            exc = crossing.remote_exception(reply, self.session.hidden)
            raise exc.with_traceback(None) from None
        return reply.get("value")
