#!/usr/bin/env bash
# ensure-package.sh: make sure a command from a Debian package is installed.
#
#   bash tools/ensure-package.sh COMMAND PACKAGE
#
# Does nothing (and prints the command's path) when COMMAND is on PATH or in
# /usr/sbin; otherwise runs apt-get update and apt-get install PACKAGE (as
# root, or through sudo), waiting up to two minutes for another apt to let
# go of its lock. Tests use it for HAProxy (`haproxy`), `make test-browser`
# for Chromium (`chromium`).
set -euo pipefail

cmd=${1:?usage: ensure-package.sh COMMAND PACKAGE}
pkg=${2:?usage: ensure-package.sh COMMAND PACKAGE}

die() { printf 'ensure-package: error: %s\n' "$*" >&2; exit 1; }

find_cmd() { PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" 2>/dev/null; }

if path=$(find_cmd); then
	echo "$path"
	exit 0
fi

SUDO=()
if [[ $EUID -ne 0 ]]; then
	command -v sudo >/dev/null 2>&1 || die "$cmd is missing, and installing $pkg needs root (sudo is not installed)"
	SUDO=(sudo)
fi
log=$(mktemp /tmp/parley-apt.XXXXXX.log)
trap 'rm -f "$log"' EXIT
apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120)
if ! "${apt[@]}" update >>"$log" 2>&1; then
	tail -n 30 "$log" >&2
	die "apt-get update failed"
fi
if ! "${apt[@]}" install -y --no-install-recommends \
	-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$pkg" >>"$log" 2>&1; then
	tail -n 30 "$log" >&2
	die "apt-get install $pkg failed"
fi
path=$(find_cmd) || die "installed $pkg, but $cmd is still not found"
printf 'ensure-package: installed %s (apt)\n' "$pkg" >&2
echo "$path"
