#!/bin/bash
# stage-legacy-tools.sh DEST - copies Debian's iptables-legacy tools and ipset, with everything
# they load, from this (Debian 12) machine into DEST as a root filesystem tree for the image:
#   * /usr/sbin/{ip,ip6}tables-legacy{,-restore,-save} (symlinks to xtables-legacy-multi) and
#     /usr/sbin/ipset: what the node daemon runs on an iptables-legacy node (repairing and
#     reconciling pods, ambient's in-pod rules and Istio's legacy host probe rule with its ipsets)
#   * every iptables extension (/usr/lib/x86_64-linux-gnu/xtables/*.so, loaded by name at run time)
#   * the shared libraries all of them need (ldd), and the dynamic loader
# Paths are kept as they are on the host, symlinks included (merged /usr: /lib -> usr/lib,
# /lib64 -> usr/lib64), so the files are Debian's own, byte for byte (check-image.py verifies that
# against the host's files and dpkg). Needs the packages iptables and ipset installed.
set -euo pipefail
umask 022   # the tree's directories become the image's: never group/world-writable
dest=${1:?usage: stage-legacy-tools.sh DEST}
TOOLS=(iptables-legacy iptables-legacy-restore iptables-legacy-save
       ip6tables-legacy ip6tables-legacy-restore ip6tables-legacy-save ipset)
XTABLES_DIR=/usr/lib/x86_64-linux-gnu/xtables

# Replicates the absolute path $1 under $dest: each symlink on the way as a symlink (and what it
# points to), then the file itself.
stage() {
  local path=$1 at="" part target
  local -a parts
  IFS=/ read -ra parts <<< "${path#/}"
  for part in "${parts[@]}"; do
    at="$at/$part"
    if [ -L "$at" ]; then
      if [ ! -L "$dest$at" ]; then
        mkdir -p "$dest$(dirname "$at")"
        cp -P "$at" "$dest$at"
      fi
      target=$(readlink "$at")
      [[ $target == /* ]] || target="$(dirname "$at")/$target"
      stage "$target"
      at=$(readlink -f "$at")
    fi
  done
  if [ -f "$at" ] && [ ! -e "$dest$at" ]; then
    mkdir -p "$dest$(dirname "$at")"
    cp -p "$at" "$dest$at"
  fi
}

files=()
for t in "${TOOLS[@]}"; do
  [ -x "/usr/sbin/$t" ] || { echo "stage-legacy-tools: /usr/sbin/$t missing (apt-get install iptables ipset)" >&2; exit 1; }
  files+=("/usr/sbin/$t")
done
files+=("$XTABLES_DIR"/*.so)
# What the loader maps for each: "name => /path (addr)" and the interpreter "/path (addr)".
mapfile -t libs < <(ldd "${files[@]}" | sed -n 's/^\s*\(\S* => \)\{0,1\}\(\/\S*\) (0x.*/\2/p' | sort -u)
[ "${#libs[@]}" -gt 0 ] || { echo "stage-legacy-tools: ldd found no libraries" >&2; exit 1; }
for f in "${files[@]}" "${libs[@]}"; do
  stage "$f"
done
echo "stage-legacy-tools: ${#files[@]} tools and extensions, ${#libs[@]} libraries in $dest"
