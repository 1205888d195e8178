#!/bin/sh
# A driver built out of the tree, as NCCL's net plugins and libfabric's
# providers are: install into a scratch folder, then build sockpair.c and
# oot_test.c with nothing but the installed headers and `pkg-config
# moshpit`, strictly (C11, POSIX 2008, -Wpedantic -Werror). The driver is
# registered with mp_driver_register (a shared and a static program), and
# loaded as a plugin through MP_DRIVER_PATH beside a missing file and a
# plugin of another ABI.
set -eu
build=$1
src=$2
here=$src/tests/integration/oot_driver
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild >/dev/null
pc=$(dirname "$(find "$dest" -name moshpit.pc | head -n 1)")
export PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$dest
cflags=$(pkg-config --cflags moshpit)
libs=$(pkg-config --libs moshpit)
libdir=$(pkg-config --variable=libdir moshpit)  # the sysroot is already applied
strict="-std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Wpedantic -Werror"

# Plugins: hidden by default, so only what MP_DRIVER_PLUGIN exports leaves them.
cc $strict $cflags -fPIC -shared -fvisibility=hidden -DSP_PLUGIN -DSP_NAME='"sockpair_so"' \
	"$here/sockpair.c" -o "$dest/libsp_plugin.so" $libs -pthread
cc $strict $cflags -fPIC -shared -fvisibility=hidden -DSP_PLUGIN -DSP_BAD_ABI \
	-DSP_NAME='"sockpair_bad"' "$here/sockpair.c" -o "$dest/libsp_bad.so" $libs -pthread
exported=$(nm -D --defined-only "$dest/libsp_plugin.so" | awk '{print $3}')
if [ "$exported" != mp_driver_plugin ]; then
	echo "libsp_plugin.so exports: $exported (want mp_driver_plugin only)"
	exit 1
fi

cc $strict $cflags "$here/oot_test.c" "$here/sockpair.c" -o "$dest/oot_test" $libs -pthread
echo "== registered (shared library)"
env -u MP_DRIVER_PATH LD_LIBRARY_PATH="$libdir" "$dest/oot_test" register
echo "== MP_DRIVER_PATH plugin"
LD_LIBRARY_PATH=$libdir MP_DRIVER_PATH="$dest/missing.so:$dest/libsp_bad.so:$dest/libsp_plugin.so" \
	"$dest/oot_test" plugin

# With nvcc, the static library needs the toolkit's libcudart_static.a, which
# the .pc file names by its absolute path on this host; the sysroot is
# prefixed to that path too, and taken off again here (as pkgconfig.sh does).
static=$(pkg-config --libs --static moshpit | sed 's/-L[^ ]*//; s/-lmoshpit//' |
	sed "s|$dest/|/|g")
cc $strict $cflags "$here/oot_test.c" "$here/sockpair.c" -o "$dest/oot_static" \
	"$libdir/libmoshpit.a" $static -pthread
echo "== registered (static library)"
env -u MP_DRIVER_PATH "$dest/oot_static" register
