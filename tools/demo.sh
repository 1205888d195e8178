#!/usr/bin/env bash
# The main job: 8 peers average with Moshpit All-Reduce over TCP on loopback.
# Installs what is missing (Debian 12), builds, runs mpbench and prints its table.
# Extra arguments go to mpbench, e.g. ./tools/demo.sh --algo=ring -e 64M
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
source tools/setup.sh
mp_configure build -Dbuildtype=release
exec build/tools/mpbench --transport=tcp --peers=8 --grid=2x2x2 -b 64K -e 16M -f 4 -n 5 -w 1 "$@"
