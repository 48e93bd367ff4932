#!/bin/sh
# `make test`'s pytest run, in two phases so the Go builds overlap the tests that need no Go program:
#   1. every Go program the suite runs (tools/gobuild.sh: Kubernetes, etcd, kwok, Kueue, JobSet, the Pulumi CLI and
#      Kubernetes provider, NVIDIA's mig-parted and device plugin) builds in the background at low CPU priority,
#      once per machine and version (a cached build returns at once), its output in build/gobuild.log;
#   2. meanwhile pytest runs everything but tests/cluster and tests/nvidia;
#   3. when the builds are done, pytest runs tests/cluster and tests/nvidia (which need them).
# A failed build fails the run (after the first phase), so its tests never pass by skipping. Exit status: the first
# failure of builds or either phase. Extra arguments go to both pytest runs; each prints its 15 slowest tests.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root"
pytest=${PYTEST:-.venv/bin/pytest}
programs="etcd kubernetes kwok kueue jobset pulumi pulumi-kubernetes mig-parted k8s-device-plugin"
mkdir -p build
log=build/gobuild.log
: > "$log"

if command -v go >/dev/null 2>&1; then
  echo "run_tests: building the Go programs the suite runs in the background (cached builds return at once): $log"
  (
    for p in $programs; do
      nice -n 19 "$here/gobuild.sh" "$p" >>"$log" 2>&1 || { echo "FAILED: $p" >>"$log"; exit 1; }
    done
  ) &
  builds=$!
else
  echo "run_tests: Go is not installed: the control-plane, real-engine and NVIDIA parser tests will skip" >&2
  builds=
fi

start=$(date +%s)
"$pytest" --durations=15 --ignore=tests/cluster --ignore=tests/nvidia "$@"
first=$?
echo "run_tests: phase 1 (no Go program) ended with $first after $(( $(date +%s) - start )) s"

built=0
if [ -n "$builds" ]; then
  waited=$(date +%s)
  echo "run_tests: waiting for the Go builds"
  wait "$builds"; built=$?
  grep -E '^(built|building|FAILED)' "$log" || true
  echo "run_tests: the Go builds ended with $built, $(( $(date +%s) - waited )) s after phase 1"
  if [ "$built" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "run_tests: a Go build failed (above; the whole log is $log): tests/cluster and tests/nvidia not run" >&2
  fi
fi

second=0
if [ "$built" -eq 0 ]; then
  start=$(date +%s)
  "$pytest" --durations=15 tests/cluster tests/nvidia "$@"
  second=$?
  echo "run_tests: phase 2 (tests/cluster, tests/nvidia) ended with $second after $(( $(date +%s) - start )) s"
fi

for rc in "$first" "$built" "$second"; do
  [ "$rc" -eq 0 ] || exit "$rc"
done
exit 0
