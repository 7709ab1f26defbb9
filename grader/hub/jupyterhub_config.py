"""JupyterHub for the course on one machine: local system users, PAM logins, one server per user, nbgrader's exchange.

``grader/hub/hub.sh up`` starts ``jupyterhub -f`` on this file as root (LocalProcessSpawner starts each user's
server as that user, which needs root), with its settings in the environment:

  DTLABS_HUB_PREFIX   the hub's Python environment and proxy (hub.sh install): PREFIX/venv, PREFIX/node
  DTLABS_HUB_STATE    the hub's database, cookie secret, pid files and log (root only)
  DTLABS_HUB_PORT     where it listens, on 127.0.0.1 only (put a TLS proxy in front for a real course)
  DTLABS_HUB_GROUPS   the Unix groups whose members may log in (students and instructors)
  DTLABS_HUB_ADMINS   hub admins (the instructors)

Users log in with their Unix password (PAM), and each one's JupyterLab runs as that user, in their home folder,
from the hub's environment (lab_utils, torch, nbgrader and its lab extension). Everything nbgrader's exchange
needs is in /etc/jupyter/nbgrader_config.py (hub.sh writes it): the course id and the exchange folder.
"""
import os

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
c.Spawner.args = [
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",  # no calls to the internet
    "--ServerApp.shutdown_no_activity_timeout=3600",
    "--MappingKernelManager.cull_idle_timeout=3600",  # an abandoned kernel (and its ranks) goes away
]
