#!/usr/bin/env bash
# CS336 assignment 2's attention tests against Lab 11's solution (grader/cs336/adapters.py is the seam):
#   grader/cs336/run.sh /path/to/assignment2-systems [pytest arguments]
# Their tests need einops (pip install einops; not a course dependency). Their files are copied to a scratch folder
# and never into the course.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
course=$(cd "$here/../.." && pwd)
theirs=${1:?usage: $0 /path/to/assignment2-systems [pytest arguments]}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tests"
cp "$theirs/tests/test_attention.py" "$theirs/tests/__init__.py" "$work/tests/"
cp "$here/adapters.py" "$here/conftest.py" "$work/tests/"
cd "$work"
DTLABS_COURSE="$course" "${PYTHON:-$course/.venv/bin/python}" -m pytest -p no:cacheprovider -q tests/test_attention.py "$@"
