#!/usr/bin/env bash
# The training study (doc/training.md): installs what is missing (Debian's
# torch, scikit-learn, matplotlib), builds, then runs tools/train.py study
# with any arguments given (say --seconds=40 --preempt=6 --out=DIR).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
export MP_WITH_TRAIN=1
source tools/setup.sh
mp_configure build
export MOSHPIT_LIB="$top/build/src/libmoshpit.so"
exec /usr/bin/python3 tools/train.py study "$@"
