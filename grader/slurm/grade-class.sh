#!/usr/bin/env bash
# Grade a class on a Slurm cluster: one array task per submission, then one merge into the course's gradebook.
#
#   grader/slurm/grade-class.sh [--wait] LAB [STUDENT ...] [-- SBATCH_OPTION ...]
#
# Run it as the instructor on a login node; it works from the course folder it lives in. In order:
#   1. `dtlabs prepare-array LAB --out RESULTS`: records LAB in the course's gradebook, snapshots it as the tasks'
#      template (so no task pays for that), writes RESULTS/LAB/roster.txt (the students given, else everyone who
#      submitted LAB under grader/work/submitted/) and creates RESULTS/logs/ for the tasks' logs. A student given
#      without a submission is reported MISSING (here and by the merge) and an id that breaks the rule NOT GRADED;
#      both are left off the roster, and the rest of the class is graded;
#   2. `sbatch --test-only`: a task the partition can never run (more CPUs or memory than any of its nodes has)
#      is refused here with the partition's sizes, instead of pending for ever;
#   3. the array (grade_array.sbatch, one task per roster line) and the merge after it (merge.sbatch,
#      --dependency=afterany), and prints both job ids. With --wait it waits for the merge, prints its log and exits
#      with its code (0: everyone merged; 1: someone NOT GRADED or MISSING, with the reason).
# Then `dtlabs grade LAB` grades only what the array did not (nothing, if all merged), exports grades.csv and
# writes the feedback.
#
# Settings (environment): DTLABS_SLURM_PARTITION, DTLABS_SLURM_ACCOUNT, DTLABS_SLURM_TIME (per task, default
# 00:40:00), DTLABS_SLURM_CPUS (per task, default 2), DTLABS_SLURM_MEM (per task, default 6G),
# DTLABS_SLURM_MAX_PARALLEL (tasks at once), DTLABS_RESULTS (default grader/work/results), DTLABS_VENV (default
# the course's .venv) or DTLABS_MODULES (modules that provide `dtlabs`), DTLABS_GRADE_ARGS (passed to grade-one,
# e.g. "--timeout 60"). Options after `--` go to sbatch as they are (a QOS, a reservation, a constraint...).
set -euo pipefail

usage() { echo "usage: $0 [--wait] LAB [STUDENT ...] [-- SBATCH_OPTION ...]" >&2; exit 2; }
WAIT=0
if [ "${1:-}" = --wait ]; then WAIT=1; shift; fi
LAB="${1:-}"; [ -n "$LAB" ] || usage; shift
STUDENTS=(); EXTRA=()
while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then shift; EXTRA=("$@"); break; fi
    STUDENTS+=("$1"); shift
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."   # the course root: sbatch runs both scripts from here (SLURM_SUBMIT_DIR)
command -v sbatch >/dev/null || { echo "grade-class: no sbatch on PATH: run this on a Slurm login node" >&2; exit 2; }
if [ -n "${DTLABS_MODULES:-}" ]; then
    module load $DTLABS_MODULES
    DTLABS=dtlabs
else
    export DTLABS_VENV="${DTLABS_VENV:-$PWD/.venv}"
    DTLABS="$DTLABS_VENV/bin/dtlabs"
fi
command -v "$DTLABS" >/dev/null || { echo "grade-class: no dtlabs at $DTLABS: run 'make install' or set DTLABS_VENV / DTLABS_MODULES" >&2; exit 2; }
RESULTS="${DTLABS_RESULTS:-grader/work/results}"
case "$RESULTS" in /*) ;; *) RESULTS="$PWD/$RESULTS" ;; esac

N=$("$DTLABS" prepare-array "$LAB" ${STUDENTS[@]+"${STUDENTS[@]}"} --out "$RESULTS")

OPTS=(--cpus-per-task="${DTLABS_SLURM_CPUS:-2}" --mem="${DTLABS_SLURM_MEM:-6G}" --time="${DTLABS_SLURM_TIME:-00:40:00}")
[ -n "${DTLABS_SLURM_PARTITION:-}" ] && OPTS+=(--partition="$DTLABS_SLURM_PARTITION")
[ -n "${DTLABS_SLURM_ACCOUNT:-}" ] && OPTS+=(--account="$DTLABS_SLURM_ACCOUNT")
OPTS+=(${EXTRA[@]+"${EXTRA[@]}"})
ARRAY="0-$(( N - 1 ))${DTLABS_SLURM_MAX_PARALLEL:+%$DTLABS_SLURM_MAX_PARALLEL}"

if ! why=$(sbatch --test-only "${OPTS[@]}" --array="$ARRAY" "$HERE/grade_array.sbatch" "$LAB" "$RESULTS" 2>&1); then
    echo "grade-class: Slurm would never run a task asking for ${OPTS[*]}:" >&2
    echo "    $why" >&2
    echo "  what the partition's nodes have:" >&2
    sinfo -h ${DTLABS_SLURM_PARTITION:+-p "$DTLABS_SLURM_PARTITION"} \
        -o '    partition %P: %D node(s), %c CPUs and %m MB each, time limit %l' >&2 || true
    echo "  set DTLABS_SLURM_CPUS / DTLABS_SLURM_MEM / DTLABS_SLURM_TIME / DTLABS_SLURM_PARTITION to fit" >&2
    exit 1
fi

ARRAY_JOB=$(sbatch --parsable "${OPTS[@]}" --array="$ARRAY" --output="$RESULTS/logs/grade-%A_%a.out" \
    "$HERE/grade_array.sbatch" "$LAB" "$RESULTS")
ARRAY_JOB=${ARRAY_JOB%%;*}
MERGE_OPTS=(--dependency="afterany:$ARRAY_JOB" --output="$RESULTS/logs/merge-%j.out")
[ -n "${DTLABS_SLURM_PARTITION:-}" ] && MERGE_OPTS+=(--partition="$DTLABS_SLURM_PARTITION")
[ -n "${DTLABS_SLURM_ACCOUNT:-}" ] && MERGE_OPTS+=(--account="$DTLABS_SLURM_ACCOUNT")
echo "grade-class: $LAB: array job $ARRAY_JOB ($N task(s)), logs in $RESULTS/logs/"
if [ "$WAIT" = 0 ]; then
    MERGE_JOB=$(sbatch --parsable "${MERGE_OPTS[@]}" "$HERE/merge.sbatch" "$LAB" "$RESULTS")
    echo "grade-class: merge job ${MERGE_JOB%%;*} runs when the array has ended (log: $RESULTS/logs/merge-${MERGE_JOB%%;*}.out)"
    echo "grade-class: then: $DTLABS grade $LAB    # exports grades.csv and feedback; grades only what the array did not"
    exit 0
fi
rc=0
out=$(sbatch --wait "${MERGE_OPTS[@]}" "$HERE/merge.sbatch" "$LAB" "$RESULTS") || rc=$?
MERGE_JOB=$(sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' <<<"$out")
echo "grade-class: merge job $MERGE_JOB ended with exit code $rc; its log:"
cat "$RESULTS/logs/merge-$MERGE_JOB.out" 2>/dev/null || echo "    (no log at $RESULTS/logs/merge-$MERGE_JOB.out)"
exit "$rc"
