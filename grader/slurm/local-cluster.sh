#!/usr/bin/env bash
# A single-node Slurm on this machine, from Debian's slurm-wlm and munge: to try the course's Slurm path
# (grade_array.sbatch, train.sbatch) without a cluster, and what tests/deploy/test_slurm.py runs on.
#
#   sudo grader/slurm/local-cluster.sh install   # apt-get install slurm-wlm munge (once)
#   sudo grader/slurm/local-cluster.sh up        # config, munged, slurmctld, slurmd; waits until the node is idle
#   grader/slurm/local-cluster.sh status         # daemons and `sinfo`
#   sudo grader/slurm/local-cluster.sh down      # stops the three daemons this script started
#
# One node (this host, with the cores and memory `slurmd -C` finds) in one partition, `debug`. It runs where
# there is no systemd and no cgroup delegation (containers): processes are tracked by parentage
# (proctrack/linuxproc), tasks are not pinned (task/none), cores and memory are scheduled (select/cons_tres,
# CR_Core_Memory), and there is no accounting database (no sacct). Jobs run as the user who submits them;
# every user reads /etc/slurm/slurm.conf. A slurm.conf this script did not write is never overwritten.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# written by dtlabs grader/slurm/local-cluster.sh"
STATE=/var/lib/slurm/dtlabs          # controller state, slurmd spool, pid files and logs of this cluster
PARTITION=${DTLABS_SLURM_PARTITION:-debug}
NODE=$(hostname -s)

die() { echo "local-cluster: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (it starts munged, slurmctld and slurmd)"; }
pidfile() { if [ "$1" = munged ]; then echo /run/munge/munged.pid; else echo "$STATE/$1.pid"; fi; }
running() { [ -f "$(pidfile "$1")" ] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }

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
    cat >"$CONF" <<EOF
$MARK (a single-node cluster for trying the course)
ClusterName=dtlabs-local
SlurmctldHost=$NODE(127.0.0.1)
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
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=5
$hw NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
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

cmd_up() {
    need_root up
    command -v slurmctld >/dev/null || die "Slurm is not installed: run '$0 install' first"
    local t0=$SECONDS
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    write_conf
    start_munge
    # -c: a cold start, no jobs left over from an earlier run of this cluster
    running slurmctld || SLURM_CONF=$CONF slurmctld -c
    running slurmd || SLURM_CONF=$CONF slurmd -c
    local state=""
    for _ in $(seq 1 120); do
        state=$(SLURM_CONF=$CONF sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
        case "$state" in idle|mixed|allocated) break ;; esac
        sleep 0.5
    done
    case "$state" in
        idle|mixed|allocated) ;;
        *) tail -n 5 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
           die "node $NODE is '${state:-unknown}' after 60 s (logs above)";;
    esac
    echo "local-cluster: up in $(( SECONDS - t0 )) s: partition $PARTITION, node $NODE ($(SLURM_CONF=$CONF sinfo -h -n "$NODE" -o '%c CPUs, %m MB')), config $CONF"
}

cmd_down() {
    need_root down
    local d pid jobs
    # cancel what is still queued or running first, so no job step outlives the daemons
    if running slurmctld; then
        jobs=$(SLURM_CONF=$CONF squeue -h -o %A 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            SLURM_CONF=$CONF scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 100); do
                [ -z "$(SLURM_CONF=$CONF squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.1
            done
        fi
    fi
    for d in slurmd slurmctld munged; do
        running "$d" || continue
        pid=$(cat "$(pidfile "$d")")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$(pidfile "$d")"
    done
    echo "local-cluster: down"
}

cmd_status() {
    local d
    for d in munged slurmctld slurmd; do
        if running "$d"; then echo "$d: running (pid $(cat "$(pidfile "$d")"))"; else echo "$d: not running"; fi
    done
    if running slurmctld; then SLURM_CONF=$CONF sinfo; fi
}

case "${1:-}" in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 install|up|down|status" >&2; exit 2 ;;
esac
