#!/usr/bin/env bash
# CS336 assignment 2's public attention and FSDP tests against the course's solutions (Lab 11's FlashAttention-2,
# Lab 03's FSDP), through grader/cs336/adapters.py in place of their adapters.py:
#   grader/cs336/run.sh /path/to/assignment2-systems [pytest arguments]
# Their files are copied to a scratch folder, never into the course. Their attention tests need einops (installed
# with the course's kernels extra); their FSDP model (cs336-basics, in their checkout) needs einops, einx and
# jaxtyping: in this Python, or in a folder named by CS336_PYTHONPATH (pip install --target DIR einx jaxtyping).
# CS336_ADAPTERS=FILE answers their tests with another adapters.py, and CS336_SELECT="NODE_ID ..." (pytest ids) runs
# only those of their tests (tests/labs/test_cs336.py's reference: torch's own FSDP2, on their bit-exact fp32 test).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
course=$(cd "$here/../.." && pwd)
theirs=${1:?usage: $0 /path/to/assignment2-systems [pytest arguments]}
shift
python=${PYTHON:-$course/.venv/bin/python}
for f in tests/__init__.py tests/common.py tests/test_attention.py tests/test_fsdp.py cs336-basics; do
    [ -e "$theirs/$f" ] || { echo "$theirs has no $f: not a checkout of stanford-cs336/assignment2-systems" >&2; exit 2; }
done
export PYTHONPATH="$theirs/cs336-basics${CS336_PYTHONPATH:+:$CS336_PYTHONPATH}"
read -r -a select <<< "${CS336_SELECT:-tests/test_attention.py tests/test_fsdp.py}"
if [[ " ${select[*]}" == *test_fsdp* ]] && ! "$python" -c "import einops, einx, jaxtyping" 2>/dev/null; then
    echo "their FSDP model (cs336-basics) needs einops, einx and jaxtyping: install them in $python or in a folder" \
         "named by CS336_PYTHONPATH (or CS336_SELECT=tests/test_attention.py runs their attention tests alone)" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tests"
cp "$theirs/tests/__init__.py" "$theirs/tests/common.py" "$theirs/tests/test_attention.py" "$theirs/tests/test_fsdp.py" \
   "$work/tests/"
cp "${CS336_ADAPTERS:-$here/adapters.py}" "$work/tests/adapters.py"
cp "$here/conftest.py" "$work/tests/"
cd "$work"
export PYTHONPATH="$work:$PYTHONPATH"
DTLABS_COURSE="$course" "$python" -m pytest -p no:cacheprovider -q --rootdir "$work" "${select[@]}" "$@"
