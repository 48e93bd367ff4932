#!/bin/sh
# Let USER connect to the kubelet's pod-resources socket: traverse (x) on the socket's directory and its parent, and
# rw on the socket. The kernel applies the kubelet's umask to a new unix socket, which caps any default ACL at r, so
# the unit gpushare-process-exporter-socket.path runs this again each time the kubelet creates the socket. Changes
# nothing that is already granted (no attribute change, no new trigger); prints "changed" when it set anything.
set -eu
user="$1"; sock="$2"; dir=$(dirname "$sock"); changed=""
grant() {  # path, perms as getfacl prints them (an entry the mask cuts down carries an #effective comment)
  if ! getfacl -cp "$1" 2>/dev/null | grep -qx "user:$user:$2"; then
    setfacl -m "u:$user:$(echo "$2" | tr -d -)" "$1"; changed=1
  fi
}
[ -d "$dir" ] || { mkdir -p "$dir"; chmod 0750 "$dir"; changed=1; }
grant "$(dirname "$dir")" --x
grant "$dir" --x
if [ -S "$sock" ]; then grant "$sock" rw-; fi
if [ -n "$changed" ]; then echo changed; fi
