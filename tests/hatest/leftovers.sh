#!/bin/sh
# Kills what an HA suite run left under its folder $1 (a test binary that
# died before its own cleanup): only processes whose command line names
# that folder, and the children of its postmasters. Nothing else.
dir=${1:?usage: leftovers.sh HA_DIR}
[ -d "$dir" ] || exit 0
ours() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -qF -- "$dir"; }
for f in "$dir"/*/data/postmaster.pid; do
  [ -f "$f" ] || continue
  pm=$(head -n1 "$f")
  if ours "$pm"; then
    kill -STOP "$pm" 2>/dev/null
    kill -KILL "$pm" $(ps -o pid= --ppid "$pm") 2>/dev/null
  fi
done
if [ -f "$dir/pids" ]; then
  for pid in $(cat "$dir/pids"); do
    ours "$pid" && kill -KILL "$pid" 2>/dev/null
  done
fi
exit 0
