#!/bin/sh
# MP_OFI_DOMAIN and MP_OFI_PROVIDER choose among fi_getinfo's entries by
# name (libfabric 1.17's ofi_rxm ignores the domain hint): with the tcp
# provider on loopback, domain "lo" is the one opened and the average is
# exact; a domain or provider that matches none fails at the driver's start
# with the names there are, on the last line the user reads.
#   ofi_select.sh MPBENCH
mpbench=$1
tmp=$(mktemp -d /tmp/ofi_select.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
run() {
	# run NAME ENV... -- mpbench's output in $tmp/NAME, its status in $tmp/NAME.rc
	name=$1
	shift
	env "$@" timeout 60 "$mpbench" --transport=ofi --peers=2 -b 4K -e 4K -n 1 -w 0 \
		--json="$tmp/$name.json" >"$tmp/$name" 2>&1
	echo $? >"$tmp/$name.rc"
}

# 1. MP_OFI_DOMAIN=lo: both peers open domain lo (logged at INFO), the mean
# is exact, and the JSON names the domain. Without MP_OFI_PROVIDER the
# provider is net (libfabric 1.17's native TCP RDM); named, tcp;ofi_rxm is
# taken by its exact name.
check_lo() {
	name=$1
	prov=$2
	if [ "$(cat "$tmp/$name.rc")" -ne 0 ]; then
		echo "FAIL: $name exited $(cat "$tmp/$name.rc")"
		cat "$tmp/$name"
		fail=1
	fi
	n=$(grep -c "ofi: provider $prov, domain lo," "$tmp/$name")
	if [ "$n" -ne 2 ]; then
		echo "FAIL: $name: $n peer(s) logged 'provider $prov, domain lo', want 2"
		grep "ofi: provider" "$tmp/$name"
		fail=1
	fi
	if ! grep -q "^# Out of bounds values : 0 OK" "$tmp/$name"; then
		echo "FAIL: $name: the average is not the exact mean"
		fail=1
	fi
	if ! grep -q '"ofi_domain": "lo"' "$tmp/$name.json" ||
		! grep -q "\"ofi_provider\": \"$prov\"" "$tmp/$name.json"; then
		echo "FAIL: $name: the JSON does not name the provider and domain"
		grep transport_detail "$tmp/$name.json"
		fail=1
	fi
}
run lo MP_OFI_DOMAIN=lo MP_DEBUG=INFO
check_lo lo net
run lo_rxm "MP_OFI_PROVIDER=tcp;ofi_rxm" MP_OFI_DOMAIN=lo MP_DEBUG=INFO
check_lo lo_rxm "tcp;ofi_rxm"

# 2. A domain and a provider that match nothing: a prompt failure whose last
# line lists what there is (loopback's domain lo among them).
check_refused() {
	name=$1
	want=$2
	rc=$(cat "$tmp/$name.rc")
	last=$(grep -v '^#' "$tmp/$name" | tail -n 1)
	if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
		echo "FAIL: $name exited $rc (want a prompt failure)"
		fail=1
	fi
	case $last in
	*"$want"*) echo "ok: $name: $last" ;;
	*)
		echo "FAIL: $name: the last line does not say '$want': $last"
		fail=1
		;;
	esac
}
run nodomain MP_OFI_DOMAIN=nonsense
check_refused nodomain "MP_OFI_DOMAIN=nonsense is not a domain of provider net; its domains are: "
grep -v '^#' "$tmp/nodomain" | tail -n 1 | grep -qE "domains are: .*\blo\b" ||
	{ echo "FAIL: lo is not among the domains listed"; fail=1; }
run noprov MP_OFI_PROVIDER=nonsense
check_refused noprov 'no libfabric provider "nonsense"'
grep -v '^#' "$tmp/noprov" | tail -n 1 | grep -q "tcp;ofi_rxm" ||
	{ echo "FAIL: tcp;ofi_rxm is not among the providers listed"; fail=1; }
[ -s "$tmp/nodomain.json" ] && { echo "FAIL: a refused run wrote results"; fail=1; }
exit $fail
