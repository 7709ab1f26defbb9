"""A student's JupyterLab on the hub, driven through the REST and websocket API JupyterLab itself uses, with a token
the student asks the hub for with their password: cheaper than a browser where the page itself is not under test
(tests/deploy/test_classmates.py)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import nbformat

from deploy_helpers import wait_for

NOTEBOOK = "classmates.ipynb"


class Kernel:
    """A kernel's websocket (/api/kernels/ID/channels, Jupyter's JSON messages), read on a thread of its own."""

    def __init__(self, url: str, token: str):
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        self.loop, self.msgs, self.cond = asyncio.new_event_loop(), [], threading.Condition()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        request = HTTPRequest(url, headers={"Authorization": f"token {token}"}, request_timeout=60)
        async def connect():
            return await websocket_connect(request, on_message_callback=self._on_message)

        self.ws = asyncio.run_coroutine_threadsafe(connect(), self.loop).result(90)
        self.session = uuid.uuid4().hex

    def _on_message(self, raw) -> None:
        if raw is not None:
            with self.cond:
                self.msgs.append(json.loads(raw))
                self.cond.notify_all()

    def execute(self, code: str) -> str:
        msg_id = uuid.uuid4().hex
        msg = {"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": self.session,
                          "date": "", "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell",
               "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                           "allow_stdin": False, "stop_on_error": True}, "buffers": []}
        self.loop.call_soon_threadsafe(self.ws.write_message, json.dumps(msg))
        return msg_id

    def _of(self, msg_id: str) -> list:
        return [m for m in self.msgs if m.get("parent_header", {}).get("msg_id") == msg_id]

    def text(self, msg_id: str) -> str:
        """What the cell showed: streams, results, errors, as JupyterLab would render their text."""
        out = []
        for m in self._of(msg_id):
            kind, content = m["msg_type"], m["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                out.append("\n".join(content["traceback"]) + "\n")
        return "".join(out)

    def wait(self, msg_id: str, timeout: float, until=None) -> str:
        """Until the cell has finished (or ``until(text)``); its text. A cell that fails or overruns fails the test."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                done = any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                           for m in self._of(msg_id))
                if (until and until(self.text(msg_id))) or done:
                    break
                assert time.monotonic() < deadline, f"cell did not finish in {timeout:.0f} s:\n{self.text(msg_id)}"
                self.cond.wait(0.5)
        errors = [m for m in self._of(msg_id) if m["msg_type"] == "error"]
        assert not errors, f"the student's cell failed:\n{self.text(msg_id)}"
        return self.text(msg_id)

    def run(self, code: str, timeout: float = 180) -> str:
        return self.wait(self.execute(code), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.ws.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


class Student:
    """A student's hub server, driven as JupyterLab drives it, with a token she asked the hub for with her password."""

    def __init__(self, hub: dict, user: str, password: str):
        import requests

        self.hub, self.user = hub["url"], user
        self.base = f"{self.hub}/user/{user}"
        got = requests.post(f"{self.hub}/hub/api/users/{user}/tokens", timeout=60,
                            json={"auth": {"username": user, "password": password}, "note": "classmates test",
                                  "expires_in": 3600})
        assert got.status_code in (200, 201), f"{user} could not get a token: {got.status_code} {got.text[:300]}"
        self.token = got.json()["token"]
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {self.token}"

    def _server(self) -> dict | None:
        return self.http.get(f"{self.hub}/hub/api/users/{self.user}", timeout=30).json().get("servers", {}).get("")

    def start(self) -> None:
        got = self.http.post(f"{self.hub}/hub/api/users/{self.user}/server", timeout=60)
        assert got.status_code in (201, 202, 400), f"{self.user}'s server: {got.status_code} {got.text[:300]}"

    def wait_ready(self) -> None:
        wait_for(lambda: (self._server() or {}).get("ready"), 180, f"{self.user}'s server")
        wait_for(lambda: self.http.get(f"{self.base}/api/status", timeout=30).status_code == 200, 60,
                 f"{self.user}'s server through the proxy")

    def stop(self) -> None:
        self.http.delete(f"{self.hub}/hub/api/users/{self.user}/server", timeout=60)
        wait_for(lambda: self._server() is None, 120, f"{self.user}'s server to stop")

    def kernel(self) -> Kernel:
        """A notebook and its kernel, as JupyterLab makes them: the file (contents API), then a session for it."""
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        got = self.http.put(f"{self.base}/api/contents/{NOTEBOOK}", timeout=60,
                            json={"type": "notebook", "format": "json", "content": json.loads(nbformat.writes(nb))})
        assert got.status_code in (200, 201), got.text[:300]
        got = self.http.post(f"{self.base}/api/sessions", timeout=120, json={
            "path": NOTEBOOK, "name": NOTEBOOK, "type": "notebook", "kernel": {"name": "python3"}})
        assert got.status_code in (200, 201), got.text[:300]
        self.session_id, kid = got.json()["id"], got.json()["kernel"]["id"]
        ws = self.base.replace("http://", "ws://") + f"/api/kernels/{kid}/channels?session_id={uuid.uuid4().hex}"
        return Kernel(ws, self.token)

    def clean(self) -> None:
        """The notebook closed, its kernel shut down (the session deleted), the file deleted."""
        self.http.delete(f"{self.base}/api/sessions/{self.session_id}", timeout=60)
        self.http.delete(f"{self.base}/api/contents/{NOTEBOOK}", timeout=60)
