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
