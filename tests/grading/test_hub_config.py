"""The course's JupyterHub config (grader/hub/jupyterhub_config.py) culls idle servers and kernels and advertises the
per-user limits, read as JupyterHub reads it (traitlets executes the file): no hub is started here.

- jupyterhub-idle-culler is a hub-managed service, with a role holding exactly the scopes its README asks for (no
  admin, no deleting users), its timeout and interval from the environment (defaults 1 h and 5 min);
- each user's server culls its idle kernels (20 min, open tabs included, running cells spared) and shuts itself down
  after the server's timeout;
- the limits are those of grader/hub/z2jh/values.yaml (Kubernetes enforces them there; here they are only advertised);
- the culler is in grader/hub/requirements.txt, and where the hub's environment is installed (hub.sh install) it is
  there, takes the flags the config passes, and JupyterHub knows every scope of the role.

A hub that really culls: tests/deploy/test_hub_culling.py (make test-deploy).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "grader" / "hub"
CULLER_SCOPES = {"list:users", "read:users:activity", "read:servers", "delete:servers"}  # its README, JupyterHub 2+
HUB_PYTHON = Path(os.environ.get("DTLABS_HUB_PREFIX", "/opt/dtlabs")) / "venv" / "bin" / "python"


def load_hub_config(monkeypatch, **env):
    """The config JupyterHub would get from the file, with only ``env`` among the DTLABS_HUB_* settings set."""
    for name in list(os.environ):
        if name.startswith("DTLABS_HUB_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return PyFileConfigLoader("jupyterhub_config.py", path=str(HUB)).load_config()


def _args(config) -> dict:
    """The single-user server's --Class.trait=value arguments, as a dict."""
    out = {}
    for arg in config.Spawner.args:
        key, _, value = arg.removeprefix("--").partition("=")
        out[key] = value
    return out


def _culler(config) -> dict:
    services = [s for s in config.JupyterHub.services if "jupyterhub_idle_culler" in s.get("command", [])]
    assert len(services) == 1, f"one jupyterhub-idle-culler service expected: {config.JupyterHub.services}"
    return services[0]


def test_the_culler_is_a_managed_service_with_only_its_scopes(monkeypatch):
    config = load_hub_config(monkeypatch)
    culler = _culler(config)
    assert culler["command"][1:3] == ["-m", "jupyterhub_idle_culler"]
    assert "--timeout=3600" in culler["command"] and "--cull-every=300" in culler["command"]
    assert not culler.get("admin"), "the culler needs scopes, not admin (JupyterHub 2+)"
    assert "api_token" not in culler, "a managed service gets its token from the hub"
    roles = [r for r in config.JupyterHub.load_roles if culler["name"] in r.get("services", [])]
    assert len(roles) == 1, config.JupyterHub.load_roles
    assert set(roles[0]["scopes"]) == CULLER_SCOPES, "--cull-users is off: admin:users is not needed"
    assert config.JupyterHub.get("allow_named_servers", False) is False  # one server per user


def test_idle_kernels_and_servers_are_culled_in_the_user_server(monkeypatch):
    args = _args(load_hub_config(monkeypatch))
    assert args["MappingKernelManager.cull_idle_timeout"] == "1200"
    assert args["MappingKernelManager.cull_interval"] == "60"
    assert args["MappingKernelManager.cull_connected"] == "True"  # an open, unattended tab does not keep ranks alive
    assert args["MappingKernelManager.cull_busy"] == "False"  # a running cell is never cut
    assert args["ServerApp.shutdown_no_activity_timeout"] == "3600"


def test_the_environment_sets_the_timeouts_and_limits(monkeypatch):
    config = load_hub_config(monkeypatch, DTLABS_HUB_CULL_TIMEOUT="30", DTLABS_HUB_CULL_EVERY="10",
                             DTLABS_HUB_KERNEL_CULL_TIMEOUT="20", DTLABS_HUB_KERNEL_CULL_EVERY="5",
                             DTLABS_HUB_MEM_LIMIT="6G", DTLABS_HUB_CPU_LIMIT="4")
    assert {"--timeout=30", "--cull-every=10"} <= set(_culler(config)["command"])
    args = _args(config)
    assert (args["MappingKernelManager.cull_idle_timeout"], args["MappingKernelManager.cull_interval"]) == ("20", "5")
    assert args["ServerApp.shutdown_no_activity_timeout"] == "30"
    assert (config.Spawner.mem_limit, config.Spawner.cpu_limit) == ("6G", 4.0)


def test_the_limits_are_the_kubernetes_values(monkeypatch):
    """One machine advertises (LocalProcessSpawner cannot enforce) what Kubernetes enforces: the same numbers, and the
    same culling."""
    config = load_hub_config(monkeypatch)
    values = yaml.safe_load((HUB / "z2jh" / "values.yaml").read_text())
    single = values["singleuser"]
    assert config.Spawner.mem_limit == single["memory"]["limit"]
    assert config.Spawner.mem_guarantee == single["memory"]["guarantee"]
    assert config.Spawner.cpu_limit == single["cpu"]["limit"]
    assert config.Spawner.cpu_guarantee == single["cpu"]["guarantee"]
    assert {f"--timeout={values['cull']['timeout']}", f"--cull-every={values['cull']['every']}"} <= set(
        _culler(config)["command"])
    kernels = single["extraFiles"]["kernel-culling"]["data"]["MappingKernelManager"]
    args = _args(config)
    for trait, value in kernels.items():
        assert args[f"MappingKernelManager.{trait}"] == str(value), trait
    text = (HUB / "jupyterhub_config.py").read_text()
    assert "NOT enforce" in text, "the config says that LocalProcessSpawner does not enforce mem_limit/cpu_limit"


def test_the_culler_is_a_requirement_of_the_hub():
    reqs = [line.split("#")[0].strip() for line in (HUB / "requirements.txt").read_text().splitlines()]
    assert any(re.match(r"jupyterhub-idle-culler\b", r) for r in reqs), reqs


def test_the_hubs_environment_runs_the_culler_as_configured(monkeypatch):
    """In the hub's environment (hub.sh install): the culler imports and parses the config's flags, and JupyterHub
    defines every scope of its role."""
    if not HUB_PYTHON.is_file():
        pytest.skip(f"no hub environment at {HUB_PYTHON} (grader/hub/hub.sh install makes it)")
    culler = _culler(load_hub_config(monkeypatch, DTLABS_HUB_CULL_TIMEOUT="1234", DTLABS_HUB_CULL_EVERY="56"))
    probe = r"""
import json, sys
try:
    import jupyterhub_idle_culler
    from jupyterhub.scopes import scope_definitions
except ImportError:
    print(json.dumps({"missing": True})); sys.exit(0)
out = {"missing": False, "unknown_scopes": sorted(set(sys.argv[1].split(",")) - set(scope_definitions))}
app_class = getattr(jupyterhub_idle_culler, "IdleCuller", None)
if app_class is not None:  # 2.x: traitlets; 1.x parses the same flags with tornado.options
    app = app_class()
    app.parse_command_line(sys.argv[2:])
    out["parsed"] = [app.timeout, app.cull_every]
print(json.dumps(out))
"""
    res = subprocess.run([str(HUB_PYTHON), "-c", probe, ",".join(CULLER_SCOPES), *culler["command"][3:]],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    if got["missing"]:
        pytest.skip(f"jupyterhub or jupyterhub-idle-culler is not in {HUB_PYTHON.parent.parent} (yet): hub.sh install "
                    "makes it again since requirements.txt changed")
    assert got["unknown_scopes"] == []
    if "parsed" in got:
        assert got["parsed"] == [1234, 56]
