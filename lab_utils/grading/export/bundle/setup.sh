#!/usr/bin/env bash
# Gradescope runs this once, while it builds the autograder's image (Ubuntu, as root): Python, bubblewrap when the
# image has it, the CPU torch wheel, and this course package from dist/ with nbgrader and the rest of its
# dependencies, at the versions the bundle was exported with (constraints.txt) where this Python can install them.
# Then it grades the lab's own solution and empty release here (the canary): an image that cannot grade fails its
# build, where the instructor sees it, instead of giving students zeros. Nothing is downloaded at grading time.
#   DTLABS_AUTOGRADER_ROOT   the root (default /autograder); the venv goes to $ROOT/dtlabs-venv
#   DTLABS_TORCH_INDEX_URL   where the torch wheel comes from (default: PyTorch's CPU index)
set -euo pipefail
ROOT="${DTLABS_AUTOGRADER_ROOT:-/autograder}"
SRC="$ROOT/source"
VENV="$ROOT/dtlabs-venv"
TORCH_INDEX="${DTLABS_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || { echo "setup.sh: no ${missing[*]} and no apt-get to install it" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if ! command -v bwrap >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap; } \
            || echo "setup.sh: bubblewrap could not be installed"
    fi
fi
# Where bubblewrap cannot build a sandbox (Gradescope's containers forbid user namespaces), submissions run as this
# unprivileged user, to whom the bundle (the lab's hidden tests), the venv and the results are closed or read-only.
SUBJECT="${DTLABS_SUBJECT_USER:-dtlabs-subject}"
if [ "$(id -u)" = 0 ]; then
    id -u "$SUBJECT" >/dev/null 2>&1 \
        || useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SUBJECT"
    chmod 700 "$SRC"
    mkdir -p "$ROOT/results"
    chmod 755 "$ROOT/results"
fi

python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
TORCH="$(grep -i '^torch==' "$SRC/constraints.txt" || echo torch)"
"$VENV/bin/python" -m pip install -q "$TORCH" --index-url "$TORCH_INDEX"
if ! "$VENV/bin/python" -m pip install -q -c "$SRC/constraints.txt" "$SRC"/dist/*.whl; then
    echo "setup.sh: the exported versions (constraints.txt) do not all install with $("$VENV/bin/python" -V);" \
         "installing the newest versions the package allows; the canary below checks they grade"
    "$VENV/bin/python" -m pip install -q "$SRC"/dist/*.whl
fi
"$VENV/bin/python" "$SRC/run_dtlabs.py" --check
