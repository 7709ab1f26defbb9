"""Where a command's CPU goes, by the role of each process it started: what `make test` spends, and on what.

`make test` is CPU-bound on 2 cores (4 workers), so its wall time is about its CPU-seconds over the cores; this says
which processes those CPU-seconds were spent in. Every process that exits while the command runs is counted by the
kernel's process accounting (``accton``, Debian's ``acct``: its CPU-seconds, pid and parent), and a sampler reads each
new process's command line from /proc every 50 ms, which names its role (``ROLES``). A process that lived under 50 ms
keeps only its name; forks that never exec'd carry their parent's command line (a rank its zygote's, a forked kernel
the one it shows).

Needs root (process accounting is system-wide) and ``accton``/``dump-acct``; it says so and exits 2 otherwise.

    sudo .venv/bin/python benchmarks/suite_cpu.py [-- COMMAND ...]   (default: make test's pytest run)
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The first rule whose needle is in a process's command line or its name names its role.
ROLES = (
    ("grader or papermill kernel", ("ipykernel_launcher",)),
    ("grading subject (student cells, their ranks)", ("lab_utils.grading.split.subject",)),
    ("nbgrader run", ("nbgrader",)),
    ("torchrun agent or worker", ("torchrun", "lab_utils.labkit.torchrun", "pt_elastic")),
    ("Lab 10 frameworks (Ray, TensorFlow, DeepSpeed)", ("ray/", "ray::", "raylet", "gcs_server", "TensorFlow",
                                                        "tensorflow", "deepspeed")),
    ("launcher ranks and zygotes", ("lab_utils.launcher.zygote", "dtlabs-rank", "dtlabs-zygote")),
    ("dtlabs command", ("lab_utils.cli", "bin/dtlabs")),
    ("papermill", ("papermill",)),
    ("browser", ("chrom",)),
    ("Jupyter server or hub", ("jupyter-lab", "jupyter_server", "jupyterhub", "configurable-http-proxy")),
    ("pytest worker, or a process a test started", ("exec(eval(sys.stdin.readline()))", "pytest")),
)


def role(name: str, cmdline: str) -> str:
    text = f"{cmdline} {name}"
    for label, needles in ROLES:
        if any(n in text for n in needles):
            return label
    return f"other ({name})"


def _sample(path: Path, stop: threading.Event) -> None:
    seen = set()
    with open(path, "w") as out:
        while not stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid in seen:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:400]
                except OSError:
                    continue
                seen.add(pid)
                out.write(json.dumps([int(pid), cmd]) + "\n")
            out.flush()
            time.sleep(0.05)


def _accounted(pacct: Path) -> list[tuple[str, float, int]]:
    """(name, CPU-seconds, pid) of every process that exited, from ``dump-acct`` (ticks of 1/100 s)."""
    rows = []
    text = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        rows.append((f[0], (float(f[2]) + float(f[3])) / 100, int(f[9])))
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else [
        str(REPO / ".venv" / "bin" / "python"), "-m", "pytest", "-n", "4", "--dist", "loadgroup", "-q",
        "-p", "no:cacheprovider"]
    if os.geteuid() != 0 or not (shutil.which("accton") and shutil.which("dump-acct")):
        print("needs root and process accounting (Debian: apt-get install acct)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dtlabs-suite-cpu-") as tmp:
        pacct, pids = Path(tmp) / "pacct", Path(tmp) / "pids.jsonl"
        pacct.touch()
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(pids, stop), daemon=True)
        sampler.start()
        subprocess.run(["accton", str(pacct)], check=True, stdout=subprocess.DEVNULL)
        start = time.monotonic()
        try:
            code = subprocess.call(command, cwd=REPO)
        finally:
            subprocess.run(["accton", "off"], stdout=subprocess.DEVNULL)
            stop.set()
            sampler.join()
        wall = time.monotonic() - start
        cmdlines = {}
        for line in pids.read_text().splitlines():
            pid, cmd = json.loads(line)
            cmdlines[pid] = cmd
        spent, count = collections.Counter(), collections.Counter()
        for name, cpu, pid in _accounted(pacct):
            label = role(name, cmdlines.get(pid, ""))
            spent[label] += cpu
            count[label] += 1
    total = sum(spent.values())
    print(f"{' '.join(command)}: exit {code}, {wall:.0f} s wall, {total:.0f} CPU-s in processes that exited "
          f"({total / wall:.2f} cores busy on average, {os.cpu_count()} cores)")
    for label, cpu in spent.most_common():
        if cpu >= 0.5:
            print(f"  {cpu:7.1f} CPU-s {100 * cpu / total:5.1f} %  {count[label]:6d} processes  {label}")
    return code


if __name__ == "__main__":
    sys.exit(main())
