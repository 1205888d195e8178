#!/bin/sh
# Install into a scratch folder, then build and run a program the way an
# integrator would: only through `pkg-config moshpit`, shared and static.
set -eu
build=$1
src=$2
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild >/dev/null
pc=$(dirname "$(find "$dest" -name moshpit.pc | head -n 1)")
export PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$dest
cflags=$(pkg-config --cflags moshpit)
libs=$(pkg-config --libs moshpit)
libdir=$(pkg-config --variable=libdir moshpit)  # the sysroot is already applied
cc -std=c11 $cflags "$src/tests/integration/example_link.c" -o "$dest/example" $libs -pthread
LD_LIBRARY_PATH=$libdir "$dest/example"
# With nvcc, the static library needs the toolkit's libcudart_static.a,
# which the .pc file names by its absolute path on this host; the sysroot
# is prefixed to that path too, and taken off again here.
static=$(pkg-config --libs --static moshpit | sed 's/-L[^ ]*//; s/-lmoshpit//' |
	sed "s|$dest/|/|g")
cc -std=c11 $cflags "$src/tests/integration/example_link.c" -o "$dest/example_static" \
	"$libdir/libmoshpit.a" $static -pthread
"$dest/example_static"
# The Python package, where meson installed it: it must import from its
# installed place, name the installed library in _paths.py, and average with
# it (MOSHPIT_LIB here only because the library sits under the scratch folder).
pkg=$(find "$dest" -path '*/moshpit/__init__.py' | head -n 1)
if [ -x /usr/bin/python3 ]; then
	[ -n "$pkg" ] || { echo "pkgconfig: the moshpit Python package was not installed" >&2; exit 1; }
	pydir=$(dirname "$(dirname "$pkg")")
	grep -qx "LIBDIR = \"${libdir#"$dest"}\"" "$pydir/moshpit/_paths.py" ||
		{ echo "pkgconfig: _paths.py does not name ${libdir#"$dest"}" >&2; exit 1; }
	PYTHONPATH=$pydir MOSHPIT_LIB=$libdir/libmoshpit.so.0 /usr/bin/python3 -c '
import array, os, sys, moshpit
assert moshpit.__file__.startswith(sys.argv[1]), moshpit.__file__
with moshpit.Context(transport="loop", npeers=1, rank=0) as c:
    c.set_peers([c.address])
    a = array.array("f", [3.0, 5.0])
    r = c.average(a)
    assert list(a) == [3.0, 5.0] and r.peers == 1, (list(a), r)
print("python package: installed and averaging")' "$pydir"
fi
