#!/usr/bin/env bash
# System packages for the SSH test hosts (tests/ssh): OpenSSH server + client, iproute2, iptables;
# Slurm (slurmctld, slurmd, clients) and munge for the Slurm cluster built on those hosts.
# Idempotent: installs only what is missing, and nothing at all when everything is present.
# Debian/Ubuntu (apt). Needs root, or sudo without a password. Called from .ci/run.
# No package's service is started (policy-rc.d): the tests run their own sshd per network namespace
# (and their own munged, slurmctld and slurmd on those hosts),
# and a system sshd would listen on 0.0.0.0:22 of the machine.
set -euo pipefail

packages=(openssh-server openssh-client iproute2 iptables slurm-wlm slurm-client munge)

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "ci_system_deps: all present (${packages[*]})"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ci_system_deps: missing ${missing[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        echo "ci_system_deps: missing ${missing[*]}; needs root or passwordless sudo" >&2
        exit 1
    fi
fi

# Keep maintainer scripts from starting services (the ssh service in particular) while installing.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    added_policy=1
fi
cleanup() {
    if [ "$added_policy" -eq 1 ]; then
        "${sudo[@]}" rm -f "$policy"
    fi
}
trap cleanup EXIT

echo "ci_system_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "ci_system_deps: done"
