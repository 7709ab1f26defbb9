"""JupyterHub for the course on one machine: local system users, PAM logins, one server per user, nbgrader's exchange.

``grader/hub/hub.sh up`` starts ``jupyterhub -f`` on this file as root (LocalProcessSpawner starts each user's
server as that user, which needs root), with its settings in the environment:

  DTLABS_HUB_PREFIX   the hub's Python environment and proxy (hub.sh install): PREFIX/venv, PREFIX/node
  DTLABS_HUB_STATE    the hub's database, cookie secret, pid files and log (root only)
  DTLABS_HUB_PORT     where it listens, on 127.0.0.1 only (put a TLS proxy in front for a real course)
  DTLABS_HUB_GROUPS   the Unix groups whose members may log in (students and instructors)
  DTLABS_HUB_ADMINS   hub admins (the instructors)

and what an idle or greedy user may hold (defaults below;
grader/README.md, "Idle servers, kernels and per-user limits"):

  DTLABS_HUB_CULL_TIMEOUT         seconds a user's server may sit idle before the hub stops it (3600)
  DTLABS_HUB_CULL_EVERY           how often the hub's culler looks, in seconds (300)
  DTLABS_HUB_KERNEL_CULL_TIMEOUT  seconds a kernel may sit idle before its server shuts it down (1200)
  DTLABS_HUB_KERNEL_CULL_EVERY    how often the server looks, in seconds (60)
  DTLABS_HUB_MEM_LIMIT, DTLABS_HUB_MEM_GUARANTEE, DTLABS_HUB_CPU_LIMIT, DTLABS_HUB_CPU_GUARANTEE  (3G, 1G, 2, 0.5):
                                  advertised to each server, NOT enforced on this spawner (see below)

Users log in with their Unix password (PAM), and each one's JupyterLab runs as that user, in their home folder,
from the hub's environment (lab_utils, torch, nbgrader and its lab extension). Everything nbgrader's exchange
needs is in /etc/jupyter/nbgrader_config.py (hub.sh writes it): the course id and the exchange folder.
"""
import os
import sys

prefix = os.environ.get("DTLABS_HUB_PREFIX", "/opt/dtlabs")
state = os.environ.get("DTLABS_HUB_STATE", "/var/lib/dtlabs-hub")
venv = os.path.join(prefix, "venv")

c = get_config()  # noqa: F821 - provided by traitlets when it executes this file

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ.get('DTLABS_HUB_PORT', '8000')}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{state}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = f"{state}/jupyterhub.pid"
c.ConfigurableHTTPProxy.command = [os.path.join(prefix, "node", "bin", "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = f"{state}/jupyterhub-proxy.pid"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:8001"

# Unix accounts, their passwords checked by PAM; no PAM session (no systemd-logind in containers)
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.PAMAuthenticator.allowed_groups = set(filter(None, os.environ.get("DTLABS_HUB_GROUPS", "dtlabs").split(",")))
c.Authenticator.admin_users = set(filter(None, os.environ.get("DTLABS_HUB_ADMINS", "").split(",")))

# One JupyterLab per user, as that user, from the hub's environment. Its kernels' ranks are the user's processes:
# other users cannot signal them or read their environment, and every rendezvous port is picked by the kernel (port 0).
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [os.path.join(venv, "bin", "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.environment = {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"}
c.Spawner.start_timeout = 120  # the first start imports JupyterLab and every extension on a busy machine
c.Spawner.http_timeout = 120

# Idle servers and kernels go away, and with a kernel the launcher's zygote and every rank it started (they die with
# their kernel: lab_utils/launcher/zygote.py), so a class's forgotten tabs do not hold the machine's memory overnight.
# - The hub stops a user's server once it has been idle (no traffic through the proxy, no activity its server
#   reports: a running cell, a terminal, an API call) for DTLABS_HUB_CULL_TIMEOUT, 1 h: jupyterhub-idle-culler (PyPI,
#   requirements.txt), a service the hub starts and stops, allowed only what it needs (its README's scopes) and not
#   admin. Stopping a server ends its kernels and terminals; the user's files stay, and logging in starts a new one.
#   The hub learns of activity every 5 min (JupyterHub.last_activity_interval), so a timeout under ~6 min is not exact.
# - The user's own server shuts a kernel down once it has been idle (no message in or out: no cell running, no output)
#   for DTLABS_HUB_KERNEL_CULL_TIMEOUT, 20 min, even while a JupyterLab tab is still open on it (cull_connected: an
#   open tab on an unattended screen is the usual way a kernel and its ranks get forgotten). A cell still running is
#   never interrupted (cull_busy stays False). The student sees the kernel gone and re-runs the cells they need.
# - The server also shuts itself down after DTLABS_HUB_CULL_TIMEOUT without kernels, terminals or requests (a
#   second line of defence should the culler be down).
cull_timeout = int(os.environ.get("DTLABS_HUB_CULL_TIMEOUT", "3600"))
cull_every = int(os.environ.get("DTLABS_HUB_CULL_EVERY", "300"))
kernel_cull_timeout = int(os.environ.get("DTLABS_HUB_KERNEL_CULL_TIMEOUT", "1200"))
kernel_cull_every = int(os.environ.get("DTLABS_HUB_KERNEL_CULL_EVERY", "60"))

c.JupyterHub.services = [
    {
        "name": "idle-culler",
        # the hub's own interpreter (PREFIX/venv's), where requirements.txt installed the culler
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={cull_timeout}",
                    f"--cull-every={cull_every}"],
        "cwd": "/",  # not the hub's state folder: nothing for it to read there (it would look for a config file)
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "description": "Find idle servers and stop them (jupyterhub-idle-culler's scopes; users are never deleted)",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]

c.Spawner.args = [
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",  # no calls to the internet
    f"--ServerApp.shutdown_no_activity_timeout={cull_timeout}",
    f"--MappingKernelManager.cull_idle_timeout={kernel_cull_timeout}",
    f"--MappingKernelManager.cull_interval={kernel_cull_every}",
    "--MappingKernelManager.cull_connected=True",
    "--MappingKernelManager.cull_busy=False",
]

# Per-user limits. What this hub enforces: one server per user (no named servers), running as that user, and the idle
# timeouts above. What it does NOT enforce: memory and CPU. LocalProcessSpawner ignores mem_limit, cpu_limit and the
# guarantees (JupyterHub's documentation of Spawner.mem_limit says so); it only passes them to each server as
# MEM_LIMIT, MEM_GUARANTEE, CPU_LIMIT and CPU_GUARANTEE in its environment (what jupyter-resource-usage shows a
# user). One student's runaway rank can still take the machine's memory: size the machine for the class (section
# "Sizing a machine for a class" of grader/README.md). To enforce them per user, use a spawner that can:
# SystemdSpawner (cgroups, one machine) or Kubernetes (grader/hub/z2jh/values.yaml, whose numbers these are: keep
# them equal, tests/grading/test_hub_config.py checks). A per-process ulimit -v is no substitute: torch reserves far
# more address space than it uses.
c.Spawner.mem_limit = os.environ.get("DTLABS_HUB_MEM_LIMIT", "3G")
c.Spawner.mem_guarantee = os.environ.get("DTLABS_HUB_MEM_GUARANTEE", "1G")
c.Spawner.cpu_limit = float(os.environ.get("DTLABS_HUB_CPU_LIMIT", "2"))
c.Spawner.cpu_guarantee = float(os.environ.get("DTLABS_HUB_CPU_GUARANTEE", "0.5"))
