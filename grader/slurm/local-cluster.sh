#!/usr/bin/env bash
# A local Slurm on this machine, from Debian's slurm-wlm and munge: to try the course's Slurm path
# (grade_array.sbatch, train.sbatch) without a cluster, and what tests/deploy/test_slurm.py (one node) and
# tests/deploy/test_slurm_nodes.py (two nodes) run on.
#
#   sudo grader/slurm/local-cluster.sh install        # apt-get install slurm-wlm munge (once)
#   sudo grader/slurm/local-cluster.sh up             # config, munged, slurmctld, slurmd; waits until the node is idle
#   sudo grader/slurm/local-cluster.sh up --nodes 2   # the same with 2 nodes that are hosts of their own (below)
#   grader/slurm/local-cluster.sh status              # daemons and `sinfo`
#   sudo grader/slurm/local-cluster.sh exec [--on HOST] CMD ...   # CMD on the cluster's network (the login host)
#   sudo grader/slurm/local-cluster.sh crash NODE     # NODE loses power: all it runs dies, it leaves the network
#   sudo grader/slurm/local-cluster.sh down           # stops every daemon, host and network it started
#
# One node (this host, with the cores and memory `slurmd -C` finds) in one partition, `debug`. It runs where
# there is no systemd and no cgroup delegation (containers): processes are tracked by parentage
# (proctrack/linuxproc), tasks are not pinned (task/none), cores and memory are scheduled (select/cons_tres,
# CR_Core_Memory), and there is no accounting database (no sacct). Jobs run as the user who submits them;
# every user reads /etc/slurm/slurm.conf. A slurm.conf this script did not write is never overwritten.
#
# With --nodes N the cluster is N+1 hosts on a private network, each a network, host-name (UTS) and mount namespace
# of this machine, so that multi-node jobs meet the problems of real ones (which address a host name resolves to):
#   dtlabs-head  10.77.0.1        the login host: slurmctld; `exec` runs sbatch, squeue, scontrol... there
#   dtlabs-nK    10.77.0.(10+K)   node K: its own slurmd (`slurmd -N dtlabs-nK`), NodeAddr=10.77.0.(10+K)
# Each host has an eth0 with its address, plugged into a Linux bridge that lives in a namespace of its own, the
# "switch" (ip netns dtlabs-switch); nothing is addressed in this machine's own network. Each host sees its own
# /etc/hosts (bind-mounted in its mount namespace, as every host of a real cluster has one) naming every host's
# address, and no `127.0.1.1 <host name>` line: with Debian's default one, a node's own name resolves to loopback,
# gloo binds there, and the other nodes never reach it (train.sbatch refuses to start a multi-node job like that).
# What the hosts share, as a cluster's hosts do: munge (its Unix socket is a path) and the file system (the course
# folder, checkpoints and logs in it). Each host is held by a process named `dtlabs-host NAME`; `crash NODE` kills
# every process in NODE's namespaces, the holder too, so its address leaves the network; `up --nodes N` again boots
# what is missing (a fresh host and slurmd) and leaves the rest running. `down` stops what either mode started and
# removes every namespace, veth and the bridge, also after a crash (it is safe to run twice). DTLABS_SLURM_SUBNET
# (default 10.77.0) picks the /24.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# written by dtlabs grader/slurm/local-cluster.sh"
STATE=/var/lib/slurm/dtlabs          # controller state, slurmd spool, pid files and logs of this cluster
PARTITION=${DTLABS_SLURM_PARTITION:-debug}
NODE=$(hostname -s)
# --nodes N: the hosts (name and address, the login host first) are listed in $HOSTS while the cluster is up
HOSTS=$STATE/hosts
SUBNET=${DTLABS_SLURM_SUBNET:-10.77.0}
SWITCH=dtlabs-switch                 # the network namespace holding the bridge
HEAD=dtlabs-head

die() { echo "local-cluster: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (it starts munged, slurmctld and slurmd)"; }
pidfile() { if [ "$1" = munged ]; then echo /run/munge/munged.pid; else echo "$STATE/$1.pid"; fi; }
running() { [ -f "$(pidfile "$1")" ] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }
multi() { [ -f "$HOSTS" ]; }
nodes() { multi && awk 'NR > 1 { print $1 }' "$HOSTS"; }

# --- the hosts of --nodes N: each a process holding a network, UTS and mount namespace --------------------------
argv0() { local a=""; read -r -d '' a 2>/dev/null <"/proc/$1/cmdline" || true; echo "$a"; }  # "" once it has ended
holder() {  # the pid of host $1's holder, if it runs
    local pid
    pid=$(cat "$STATE/host-$1.pid" 2>/dev/null) || return 1
    [ "$(argv0 "$pid")" = "dtlabs-host $1" ] && echo "$pid"
}
on() {  # on HOST CMD...: CMD in HOST's namespaces, in the current folder
    local pid
    pid=$(holder "$1") || die "host $1 is not running (up --nodes N boots it)"
    shift
    nsenter -t "$pid" -n -u -m --wd="$PWD" -- "$@"
}
make_host() {  # make_host NAME ADDRESS: a new host on the switch, if it does not run
    holder "$1" >/dev/null && return 0
    # its own host name and /etc/hosts, loopback up; then the holder sleeps, named so that `down` finds it
    unshare --net --uts --mount --propagation private -- bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts &&
        ip link set lo up && exec -a "dtlabs-host $1" sleep infinity' _ "$1" "$STATE/etc-hosts" \
        </dev/null >/dev/null 2>&1 &
    echo $! >"$STATE/host-$1.pid"
    for _ in $(seq 1 50); do holder "$1" >/dev/null && break; sleep 0.1; done
    local pid
    pid=$(holder "$1") || die "host $1 did not start"
    ip -n "$SWITCH" link del "v-$1" 2>/dev/null || true
    ip -n "$SWITCH" link add "v-$1" type veth peer name eth0 netns "$pid"
    ip -n "$SWITCH" link set "v-$1" master br0 up
    nsenter -t "$pid" -n ip addr add "$2/24" dev eth0
    nsenter -t "$pid" -n ip link set eth0 up
}
host_pids() {  # the pids of every process of the host whose holder is $1: in its namespaces, and their descendants
    local ns                                      # (a job's sandbox may have namespaces of its own)
    ns=$(stat -L -c %i "/proc/$1/ns/net" "/proc/$1/ns/uts" "/proc/$1/ns/mnt" 2>/dev/null | paste -sd ' ') || return 0
    { stat -L -c '%i %n' /proc/[0-9]*/ns/net /proc/[0-9]*/ns/uts /proc/[0-9]*/ns/mnt 2>/dev/null || true
      ps -e -o pid=,ppid= | awk '{ print "ppid", $1, $2 }'; } |  # (processes that end meanwhile: || true)
        awk -v ns="$ns" 'BEGIN { split(ns, n, " "); for (i in n) mine[n[i]] = 1 }
            $1 == "ppid" { parent[$2] = $3; next }
            $1 in mine { split($2, p, "/"); keep[p[3]] = 1 }
            END { do { more = 0; for (c in parent) if (!(c in keep) && (parent[c] in keep)) { keep[c] = 1; more = 1 } }
                  while (more); for (c in keep) print c }'
}
kill_host() {  # kill_host NAME: every process of the host at once (SIGKILL, as a power cut), its holder too; its
    local pid pids                                      # network namespace, eth0 and veth go with the last of them
    pid=$(holder "$1") || { rm -f "$STATE/host-$1.pid"; return 0; }
    pids=$(host_pids "$pid")
    kill -9 $pids 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$STATE/host-$1.pid"
}

ctl() {  # a Slurm client command, where the controller can be reached
    if multi; then on "$HEAD" env SLURM_CONF="$CONF" "$@"; else SLURM_CONF=$CONF "$@"; fi
}

cmd_install() {
    need_root install
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && command -v sbatch >/dev/null; then
        echo "local-cluster: slurm-wlm and munge are installed"; return 0
    fi
    command -v apt-get >/dev/null || die "no apt-get here: install Slurm (slurmctld, slurmd, sbatch) and munge yourself"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq -o DPkg::Lock::Timeout=120
    apt-get install -y -qq -o DPkg::Lock::Timeout=120 --no-install-recommends slurm-wlm munge >/dev/null
    echo "local-cluster: installed $(slurmctld -V)"
}

write_conf() {
    if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script; a real cluster is configured here, use it instead"
    fi
    # NodeName=... CPUs=... RealMemory=... as slurmd measures this host; keep 1 GiB for the daemons
    local hw mem
    hw=$(slurmd -C | head -n 1)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    hw="${hw/RealMemory=$mem/RealMemory=$(( mem > 2048 ? mem - 1024 : mem ))}"
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld" "$STATE/spool"
    chown slurm: "$STATE/ctld"
    # one node (this host, on loopback), or with --nodes every node of $HOSTS at its own address (each measured as
    # this machine: they share its cores); each node's slurmd keeps its pid file, log and spool apart (%n: its name)
    local what="a single-node cluster for trying the course" ctld="$NODE(127.0.0.1)" slurmd=slurmd
    local spool="$STATE/spool" nodelines="$hw NodeAddr=127.0.0.1 State=UNKNOWN" partnodes=$NODE name addr
    if multi; then
        what="$(nodes | wc -l) nodes, each a host of its own on a private network ($SUBNET.0/24)"
        ctld="$HEAD($(awk -v h="$HEAD" '$1 == h { print $2 }' "$HOSTS"))" slurmd="slurmd-%n" spool="$STATE/spool/%n"
        nodelines="" partnodes=""
        while read -r name addr; do
            [ "$name" = "$HEAD" ] && continue
            mkdir -p "$STATE/spool/$name"
            nodelines+="${nodelines:+$'\n'}NodeName=$name ${hw#* } NodeAddr=$addr State=UNKNOWN"
            partnodes+="${partnodes:+,}$name"
        done <"$HOSTS"
    fi
    cat >"$CONF" <<EOF
$MARK ($what)
ClusterName=dtlabs-local
SlurmctldHost=$ctld
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
# no systemd, no cgroup delegation: track processes by parentage, do not bind tasks
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/$slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/$slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=5
$nodelines
PartitionName=$PARTITION Nodes=$partnodes Default=YES MaxTime=INFINITE State=UP
EOF
    chmod 644 "$CONF"
}

start_munge() {
    if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    [ -f /etc/munge/munge.key ] || { mungekey --create >/dev/null; chown munge: /etc/munge/munge.key; }
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge: /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    runuser -u munge -- munged
    munge -n </dev/null | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
}

wait_idle() {  # wait_idle NODE...: until each is idle (or running jobs), else its logs and die
    local node state
    for node in "$@"; do
        state=""
        for _ in $(seq 1 120); do
            state=$(ctl sinfo -h -n "$node" -o %T 2>/dev/null || true)
            case "$state" in idle|mixed|allocated) break ;; esac
            sleep 0.5
        done
        case "$state" in
            idle|mixed|allocated) ;;
            *) tail -n 5 "$STATE/slurmctld.log" "$STATE"/slurmd*.log >&2 || true
               die "node $node is '${state:-unknown}' after 60 s (logs above)";;
        esac
    done
}

cmd_up() {
    need_root up
    command -v slurmctld >/dev/null || die "Slurm is not installed: run '$0 install' first"
    local n=0
    case "${1:-}" in
        "") ;;
        --nodes) n=${2:-} ;;
        --nodes=*) n=${1#--nodes=} ;;
        *) die "usage: $0 up [--nodes N]" ;;
    esac
    [[ "$n" =~ ^[0-9]+$ ]] || die "--nodes takes a number of nodes, not '$n'"
    if [ "$n" -gt 0 ]; then up_nodes "$n"; return; fi
    multi && die "a cluster of $(nodes | wc -l) nodes is up here: '$0 down' first"
    local t0=$SECONDS
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    write_conf
    start_munge
    # -c: a cold start, no jobs left over from an earlier run of this cluster
    running slurmctld || SLURM_CONF=$CONF slurmctld -c
    running slurmd || SLURM_CONF=$CONF slurmd -c
    wait_idle "$NODE"
    echo "local-cluster: up in $(( SECONDS - t0 )) s: partition $PARTITION, node $NODE ($(SLURM_CONF=$CONF sinfo -h -n "$NODE" -o '%c CPUs, %m MB')), config $CONF"
}

up_nodes() {  # up --nodes N: the switch, the login host, N nodes; boots again only what is not running
    local n=$1 t0=$SECONDS i name addr
    if multi; then
        [ "$(nodes | wc -l)" = "$n" ] || die "a cluster of $(nodes | wc -l) nodes is up here: '$0 down' first"
    elif running slurmctld || running slurmd; then
        die "the single-node cluster is up here: '$0 down' first"
    fi
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    { echo "$HEAD $SUBNET.1"; for i in $(seq 1 "$n"); do echo "dtlabs-n$i $SUBNET.$(( 10 + i ))"; done; } >"$HOSTS"
    # every host's /etc/hosts: every host's bridge address, and its own name never on loopback
    { echo "127.0.0.1 localhost"; awk '{ print $2, $1 }' "$HOSTS"; } >"$STATE/etc-hosts"
    chmod 644 "$HOSTS" "$STATE/etc-hosts"
    write_conf
    start_munge
    [ -e "/run/netns/$SWITCH" ] || ip netns add "$SWITCH"
    ip -n "$SWITCH" link show br0 >/dev/null 2>&1 || ip -n "$SWITCH" link add br0 type bridge
    ip -n "$SWITCH" link set br0 up
    while read -r name addr; do make_host "$name" "$addr"; done <"$HOSTS"
    running slurmctld || on "$HEAD" env SLURM_CONF="$CONF" slurmctld -c
    for name in $(nodes); do
        running "slurmd-$name" || on "$name" env SLURM_CONF="$CONF" slurmd -c -N "$name"
    done
    wait_idle $(nodes)
    echo "local-cluster: up in $(( SECONDS - t0 )) s: partition $PARTITION, $n nodes" \
         "($(ctl sinfo -h -N -o '%N at %o: %c CPUs, %m MB' | paste -sd ';' | sed 's/;/; /g'))," \
         "controller on $HEAD at $SUBNET.1," \
         "config $CONF; client commands: $0 exec CMD"
}

stop() {  # stop DAEMON: TERM, up to 5 s, then KILL
    local pid
    running "$1" || { rm -f "$(pidfile "$1")"; return 0; }
    pid=$(cat "$(pidfile "$1")")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$(pidfile "$1")"
}

cmd_down() {
    need_root down
    local d h f jobs
    # cancel what is still queued or running first, so no job step outlives the daemons
    if running slurmctld && { ! multi || holder "$HEAD" >/dev/null; }; then
        jobs=$(ctl squeue -h -o %A 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            ctl scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 100); do
                [ -z "$(ctl squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.1
            done
        fi
    fi
    for f in "$STATE"/slurmd-*.pid; do [ -e "$f" ] && d=$(basename "$f" .pid) && stop "$d"; done
    for d in slurmd slurmctld; do stop "$d"; done
    # the hosts of --nodes: by their pid files, and any holder whose pid file is lost (a crash of this script)
    for f in "$STATE"/host-*.pid; do [ -e "$f" ] && h=$(basename "$f" .pid) && kill_host "${h#host-}"; done
    for f in /proc/[0-9]*; do
        h=""; read -r -d '' h 2>/dev/null <"$f/cmdline" || true  # its argv[0], read without a fork
        if [[ "$h" =~ ^dtlabs-host\ (dtlabs-[a-z0-9]+)$ ]]; then
            echo "${f#/proc/}" >"$STATE/host-${BASH_REMATCH[1]}.pid"; kill_host "${BASH_REMATCH[1]}"
        fi
    done
    if [ -e "/run/netns/$SWITCH" ]; then ip netns del "$SWITCH"; fi  # the bridge, and the veths still plugged in
    stop munged
    rm -f "$HOSTS" "$STATE/etc-hosts"
    echo "local-cluster: down"
}

cmd_crash() {  # crash NODE: as if NODE lost power
    need_root crash
    multi || die "crash needs a cluster of nodes (up --nodes N)"
    nodes | grep -qx -- "${1:-}" || die "no node '${1:-}': the nodes are $(nodes | paste -sd ' ')"
    holder "$1" >/dev/null || die "$1 is already down"
    kill_host "$1"
    rm -f "$(pidfile "slurmd-$1")"
    echo "local-cluster: $1 crashed: its slurmd and all it ran are killed and its address has left the network;" \
         "Slurm marks it DOWN after SlurmdTimeout; '$0 up --nodes $(nodes | wc -l)' boots it again"
}

cmd_exec() {  # exec [--on HOST] CMD...: CMD where the controller is reached (the login host), or on HOST
    local host=$HEAD
    if [ "${1:-}" = --on ]; then host=${2:?exec --on HOST CMD}; shift 2; fi
    [ $# -gt 0 ] || die "usage: $0 exec [--on HOST] CMD ..."
    if ! multi; then SLURM_CONF=$CONF exec "$@"; fi
    need_root exec
    on "$host" env SLURM_CONF="$CONF" "$@"
}

cmd_status() {
    local d name addr
    for d in munged slurmctld $(if multi; then nodes | sed 's/^/slurmd-/'; else echo slurmd; fi); do
        if running "$d"; then echo "$d: running (pid $(cat "$(pidfile "$d")"))"; else echo "$d: not running"; fi
    done
    if multi; then
        while read -r name addr; do
            if holder "$name" >/dev/null; then echo "host $name: $addr"; else echo "host $name: down"; fi
        done <"$HOSTS"
    fi
    if running slurmctld; then
        if ! multi; then SLURM_CONF=$CONF sinfo
        elif [ "$(id -u)" = 0 ]; then ctl sinfo
        else echo "(the controller is on $HEAD's network: sudo $0 exec sinfo)"; fi
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    exec) shift; cmd_exec "$@" ;;
    crash) shift; cmd_crash "$@" ;;
    *) echo "usage: $0 install|up [--nodes N]|down|status|exec [--on HOST] CMD ...|crash NODE" >&2; exit 2 ;;
esac
