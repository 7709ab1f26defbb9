#!/usr/bin/env bash
# The course on a JupyterHub on this machine: local Unix users log in with their password, each gets a JupyterLab
# running as themselves, and nbgrader's exchange carries labs, submissions and feedback between them.
#
#   sudo grader/hub/hub.sh install   # PREFIX/venv: JupyterHub (PyPI), the course package, torch, JupyterLab with
#                                    # nbgrader's extension; PREFIX/node: configurable-http-proxy (npm)
#   sudo DTLABS_INSTRUCTOR=teacher grader/hub/hub.sh up     # exchange, /etc/jupyter/nbgrader_config.py, the hub
#   grader/hub/hub.sh status
#   sudo grader/hub/hub.sh down      # stops the hub, its proxy and every user's server
#   sudo grader/hub/hub.sh hidepid   # /proc remounted hidepid=invisible: each user sees only their own processes
#
# Settings (environment): DTLABS_HUB_PREFIX (default /opt/dtlabs), DTLABS_HUB_STATE (/var/lib/dtlabs-hub),
# DTLABS_HUB_PORT (8000, on 127.0.0.1), DTLABS_HUB_GROUPS (Unix groups allowed to log in, default
# dtlabs-students,dtlabs-instructors), DTLABS_INSTRUCTOR (owns the course in the exchange; a hub admin),
# DTLABS_EXCHANGE (/srv/nbgrader/exchange), TORCH_SPEC (install: default torch; torch==2.13.0 on CPU machines),
# DTLABS_HUB_HIDEPID=1 (up: hidepid first, opt-in: it is the whole machine's /proc), DTLABS_HUB_HIDEPID_GROUP (a group
# whose members still see every process: a monitoring service's; default none). Idle servers and kernels are stopped
# (jupyterhub-idle-culler, kernel culling): DTLABS_HUB_CULL_TIMEOUT (3600 s), DTLABS_HUB_KERNEL_CULL_TIMEOUT (1200 s)
# and the other settings that jupyterhub_config.py names pass through `up` to the hub.
# The course id is grader/nbgrader_config.py's: dtlabs.
#
# Students see nbgrader's Assignments list and Validate button; the formgrader, course list and assignment creation
# are turned off for everyone in PREFIX/venv (an instructor grades from the course folder with its own venv:
# grader/README.md, "Running the course").
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COURSE_SRC="$(cd "$HERE/../.." && pwd)"
PREFIX=${DTLABS_HUB_PREFIX:-/opt/dtlabs}
VENV=$PREFIX/venv
STATE=${DTLABS_HUB_STATE:-/var/lib/dtlabs-hub}
PORT=${DTLABS_HUB_PORT:-8000}
EXCHANGE=${DTLABS_EXCHANGE:-/srv/nbgrader/exchange}
COURSE_ID=dtlabs
GROUPS_ALLOWED=${DTLABS_HUB_GROUPS:-dtlabs-students,dtlabs-instructors}
NBCONF=/etc/jupyter/nbgrader_config.py
MARK="# written by dtlabs grader/hub/hub.sh"
PY=/usr/bin/python3   # readable by every user (a pyenv or conda under /root is not)

die() { echo "hub: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (the hub starts each user's server as that user)"; }
hub_pid() { [ -f "$STATE/jupyterhub.pid" ] && cat "$STATE/jupyterhub.pid"; }
running() { local p; p=$(hub_pid 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }
answers() { "$PY" - "$PORT" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/hub/api", timeout=2).read()
except Exception:
    sys.exit(1)
EOF
}

cmd_install() {
    need_root install
    local t0=$SECONDS
    "$PY" -c "import venv, ensurepip" 2>/dev/null || die "$PY has no venv/ensurepip: apt-get install python3-venv"
    command -v npm >/dev/null || die "no npm: apt-get install npm (for configurable-http-proxy)"
    # one install at a time: a second one (another terminal, a test run beside another) waits for the first, then
    # finds the environment built instead of removing it under the first one's feet
    mkdir -p "$PREFIX"
    exec 9>"$PREFIX/.install.lock"
    if command -v flock >/dev/null; then flock 9; fi
    # The environment is rebuilt only when what it is made of changed; the course package is always reinstalled.
    local stamp
    stamp=$(cat "$COURSE_SRC/pyproject.toml" "$HERE/requirements.txt" <(echo "${TORCH_SPEC:-torch}") | sha256sum | cut -c1-16)
    if [ "$(cat "$VENV/.dtlabs-stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$VENV"
        "$PY" -m venv "$VENV"
        # one resolver run for everything; TORCH_SPEC=torch==2.13.0 is the CPU wheel (a bare "torch" may be CUDA's)
        # tried up to three times: a download that breaks off mid-file fails pip, and a fresh request usually works
        local try
        for try in 1 2 3; do
            "$VENV/bin/pip" install -q --no-compile "${TORCH_SPEC:-torch}" -r "$HERE/requirements.txt" "$COURSE_SRC" && break
            [ "$try" = 3 ] && die "pip failed three times (see above)"
            echo "pip failed (try $try of 3); trying again in 10 s" >&2; sleep 10
        done
        "$VENV/bin/python" -m compileall -qq -j 0 "$VENV/lib" || true
        echo "$stamp" >"$VENV/.dtlabs-stamp"
    else
        "$VENV/bin/pip" install -q --no-deps --force-reinstall "$COURSE_SRC"
    fi
    # students: the Assignments list and Validate; not the instructor's tools
    "$VENV/bin/jupyter" labextension disable --level=sys_prefix @jupyter/nbgrader:formgrader \
        @jupyter/nbgrader:course-list @jupyter/nbgrader:create-assignment >/dev/null 2>&1
    "$VENV/bin/jupyter" server extension disable --sys-prefix nbgrader.server_extensions.formgrader \
        nbgrader.server_extensions.course_list >/dev/null 2>&1
    # no calls to the internet from anyone's JupyterLab (news, update checks)
    mkdir -p "$VENV/share/jupyter/lab/settings"
    cat >"$VENV/share/jupyter/lab/settings/overrides.json" <<'EOF'
{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}
EOF
    if [ ! -x "$PREFIX/node/bin/configurable-http-proxy" ]; then
        npm install -g --silent --no-fund --no-audit --prefix "$PREFIX/node" configurable-http-proxy@4 >/dev/null
    fi
    chmod -R a+rX "$PREFIX"
    echo "hub: installed in $(( SECONDS - t0 )) s: $("$VENV/bin/jupyterhub" --version 2>/dev/null | tail -n 1) in $VENV," \
         "configurable-http-proxy $("$PREFIX/node/bin/configurable-http-proxy" --version)"
}

write_nbgrader_config() {
    if [ -f "$NBCONF" ] && ! grep -qF "$MARK" "$NBCONF"; then
        die "$NBCONF exists and was not written by this script; add Exchange.root=$EXCHANGE and course_id=$COURSE_ID to it yourself"
    fi
    mkdir -p "$(dirname "$NBCONF")"
    cat >"$NBCONF" <<EOF
$MARK
# Read by every user's nbgrader (students' Assignments list and Validate button, the instructor's commands).
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "$COURSE_ID"
c.Exchange.root = "$EXCHANGE"
c.Execute.timeout = 180  # the course's per-cell limit for Validate (nbgrader#1463: not ExecutePreprocessor.timeout)
EOF
    chmod 644 "$NBCONF"
}

make_exchange() {
    # world-writable like nbgrader wants, sticky so nobody can remove or rename what another user put there
    mkdir -p "$EXCHANGE"
    chmod 1777 "$EXCHANGE"
    chmod a+rx "$(dirname "$EXCHANGE")"
    if [ -n "${DTLABS_INSTRUCTOR:-}" ]; then
        id "$DTLABS_INSTRUCTOR" >/dev/null 2>&1 || die "no user $DTLABS_INSTRUCTOR (DTLABS_INSTRUCTOR)"
        # the instructor owns the course's folder before any student could claim the course id
        mkdir -p "$EXCHANGE/$COURSE_ID"
        chown "$DTLABS_INSTRUCTOR": "$EXCHANGE/$COURSE_ID"
        chmod 755 "$EXCHANGE/$COURSE_ID"
    fi
}

cmd_hidepid() {
    # Every user sees only their own processes in /proc (ps, top): a classmate no longer sees that another student's
    # kernel and ranks exist, nor their command lines. It is the machine's /proc, not the hub's: it stays after
    # `down` (an fstab line keeps it over a reboot: grader/README.md). Root, and the group named, still see all.
    need_root hidepid
    local opts gid=""
    if [ -n "${DTLABS_HUB_HIDEPID_GROUP:-}" ]; then
        gid=$(getent group "$DTLABS_HUB_HIDEPID_GROUP" | cut -d: -f3 || true)
        [ -n "$gid" ] || die "no group $DTLABS_HUB_HIDEPID_GROUP (DTLABS_HUB_HIDEPID_GROUP)"
    fi
    for opts in hidepid=invisible hidepid=2; do   # invisible: Linux 5.8+; 2 before it
        if mount -o "remount,$opts${gid:+,gid=$gid}" /proc 2>/dev/null; then
            echo "hub: /proc remounted $opts${gid:+,gid=$gid}: users see only their own processes"
            return 0
        fi
    done
    die "could not remount /proc with hidepid (a container without CAP_SYS_ADMIN?); see grader/README.md"
}

proc_privacy() {
    local opts
    opts=$(awk '$2 == "/proc" && $3 == "proc" {o=$4} END {print o}' /proc/mounts)
    case ",$opts," in
        *,hidepid=invisible,*|*,hidepid=2,*) echo "each user sees only their own processes (/proc $opts)" ;;
        *) echo "every user sees every process in ps (/proc without hidepid: grader/hub/hub.sh hidepid)" ;;
    esac
}

cmd_up() {
    need_root up
    if [ "${DTLABS_HUB_HIDEPID:-0}" = 1 ]; then cmd_hidepid; fi
    [ -x "$VENV/bin/jupyterhub" ] && [ -x "$PREFIX/node/bin/configurable-http-proxy" ] || die "not installed: run '$0 install' first"
    local t0=$SECONDS
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    write_nbgrader_config
    make_exchange
    if running; then echo "hub: already running (pid $(hub_pid)) on http://127.0.0.1:$PORT"; return 0; fi
    # root executes the hub's config: a root-owned copy, never the course folder's (its owner could edit it)
    install -m 600 "$HERE/jupyterhub_config.py" "$STATE/jupyterhub_config.py"
    (
        cd "$STATE"
        export DTLABS_HUB_PREFIX=$PREFIX DTLABS_HUB_STATE=$STATE DTLABS_HUB_PORT=$PORT DTLABS_HUB_GROUPS=$GROUPS_ALLOWED
        export DTLABS_HUB_ADMINS=${DTLABS_INSTRUCTOR:-}
        export PATH="$PREFIX/node/bin:$VENV/bin:/usr/local/bin:/usr/bin:/bin"
        setsid "$VENV/bin/jupyterhub" -f "$STATE/jupyterhub_config.py" >>"$STATE/jupyterhub.log" 2>&1 </dev/null &
    )
    for _ in $(seq 1 240); do
        answers && break
        sleep 0.25
    done
    answers || { tail -n 20 "$STATE/jupyterhub.log" >&2; die "the hub did not answer on port $PORT within 60 s (log above)"; }
    echo "hub: up in $(( SECONDS - t0 )) s on http://127.0.0.1:$PORT (log $STATE/jupyterhub.log); exchange $EXCHANGE," \
         "course $COURSE_ID; groups allowed: $GROUPS_ALLOWED; $(proc_privacy)"
}

cmd_down() {
    need_root down
    local pid proxy
    pid=$(hub_pid 2>/dev/null || true)
    proxy=$(cat "$STATE/jupyterhub-proxy.pid" 2>/dev/null || true)
    local services=""
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        # its managed services (the idle culler): a hub that had to be killed leaves them running under init
        services=$(pgrep -P "$pid" 2>/dev/null | tr '\n' ' ' || true)
        kill -TERM "$pid"   # the hub stops every user's server and the proxy it started, then exits
        for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    if [ -n "$proxy" ] && kill -0 "$proxy" 2>/dev/null; then kill -TERM "$proxy" 2>/dev/null || true; fi
    # shellcheck disable=SC2086 # one pid a word
    [ -z "$services" ] || kill -TERM $services 2>/dev/null || true
    rm -f "$STATE/jupyterhub.pid" "$STATE/jupyterhub-proxy.pid"
    echo "hub: down"
}

cmd_status() {
    if running; then
        echo "hub: running (pid $(hub_pid)) on http://127.0.0.1:$PORT; $(answers && echo answering || echo 'not answering');" \
             "$(proc_privacy)"
    else
        echo "hub: not running"
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    hidepid) cmd_hidepid ;;
    *) echo "usage: $0 install|up|down|status|hidepid" >&2; exit 2 ;;
esac
