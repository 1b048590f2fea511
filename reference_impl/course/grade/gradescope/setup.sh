#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image, with the zip
# unpacked in /autograder/source. It installs the kit's grading part and PyTorch (the build
# named below) into an environment of its own, /autograder/venv: an image's system Python may
# refuse installs. Written by `python -m reference_impl.course.grade.gradescope`.
set -euo pipefail
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$(dirname "$SOURCE")/venv"
TORCH_BUILD="@TORCH_BUILD@"  # cpu, or cuda
TORCH="@TORCH@"              # the kit's requirement

if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv python3-pip
fi
python3 -m venv "$VENV"
if [ "$TORCH_BUILD" = cpu ]; then
    # PyTorch's CPU wheels: a tenth of the CUDA build's size.
    "$VENV/bin/pip" install -q "$TORCH" --extra-index-url https://download.pytorch.org/whl/cpu
else
    "$VENV/bin/pip" install -q "$TORCH"
fi
"$VENV/bin/pip" install -q -e "$SOURCE/kit[grade]"
# The hidden checks are the grader's: closed to every other user (a box user among them).
chmod 700 "$SOURCE/kit/tests/labs/hidden"
"$VENV/bin/python" -m reference_impl.course.grade.gradescope.run --check
