#!/bin/bash
# `make test`: lint and the whole pytest suite, with the Go builds overlapping everything that does not need them.
#   1. the test tools come from apt where missing (make test-deps), then every Go program the suite runs builds in the
#      background at low CPU priority (tools/gobuild.sh, once per machine and version: a cached build returns at
#      once), one after another in the order the test groups below need them; build/gobuild.log has their output and
#      build/gobuild/<program>.ok or .failed says how each ended;
#   2. meanwhile the virtualenv, lint and promtool (make venv lint promtool), then pytest on everything but
#      tests/cluster and tests/nvidia (phase 1);
#   3. then each group of phase 2 runs as soon as the programs it needs are built, while the rest still build:
#      tests/nvidia (NVIDIA's mig-parted and device plugin), the control-plane tests (etcd, Kubernetes, kwok), the
#      real-engine tests (those and the Pulumi CLI and Kubernetes provider), the queue tests (those and Kueue and the
#      JobSet controller). A test of tests/cluster belongs to the control-plane group unless CLUSTER_GROUPS below names
#      it; one that needs a program its group does not wait for fails on a fresh machine (never skips), and
#      tests/unit/tools/test_run_tests.py checks that each test's fixtures match its group.
# A failed lint stops the run (and the builds). A failed build fails the run, and the groups that need that program
# do not run, so their tests never pass by skipping. Exit status: the first failure. Extra arguments go to every
# pytest run; each prints its 15 slowest tests.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root"
pytest=${PYTEST:-.venv/bin/pytest}
make=${MAKE:-make}
# Build order: the programs of the earliest and longest groups first.
programs="mig-parted k8s-device-plugin etcd kubernetes kwok pulumi pulumi-kubernetes kueue jobset"
control_plane="etcd kubernetes kwok"
# tests/cluster groups other than the control-plane one: name | the programs it waits for | its test files.
CLUSTER_GROUPS=(
  "real-engine|$control_plane pulumi pulumi-kubernetes|tests/cluster/test_pulumi_up.py tests/cluster/test_pulumi_ops.py tests/cluster/test_pulumi_rollout.py"
  "queues|$control_plane kueue jobset|tests/cluster/test_kueue.py tests/cluster/test_kueue_metrics.py tests/cluster/test_dra_partitionable.py tests/cluster/test_jobset.py"
)
mkdir -p build
log=build/gobuild.log
state=build/gobuild
began=$(date +%s)
elapsed() { echo "$(( $(date +%s) - began )) s into the run"; }

"$make" --no-print-directory test-deps || exit $?

builds=
stop_builds() {
  # The builder runs in its own session (setsid), so its go processes stop with it: only what this script started.
  if [ -n "$builds" ] && kill -0 "$builds" 2>/dev/null; then
    echo "run_tests: stopping the Go builds (process group $builds)" >&2
    kill -TERM -- "-$builds" 2>/dev/null
  fi
}
trap stop_builds EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$state"; mkdir -p "$state"
: > "$log"
if command -v go >/dev/null 2>&1; then
  echo "run_tests: building the Go programs the suite runs in the background (cached builds return at once): $log"
  setsid sh -c '
    state=$1 log=$2 gobuild=$3; shift 3
    for p in "$@"; do
      if nice -n 19 "$gobuild" "$p" >>"$log" 2>&1; then touch "$state/$p.ok"
      else echo "FAILED: $p" >>"$log"; touch "$state/$p.failed"; fi
    done' sh "$state" "$log" "$here/gobuild.sh" $programs &
  builds=$!
else
  echo "run_tests: Go is not installed: the control-plane, real-engine and NVIDIA parser tests will skip" >&2
fi

"$make" --no-print-directory venv lint promtool || exit $?

# Waits until every program named is built; 1 (naming the failed build) when one of them failed or never will be.
ready() {
  [ -n "$builds" ] || return 0
  local p
  for p in "$@"; do
    while [ ! -e "$state/$p.ok" ] && [ ! -e "$state/$p.failed" ]; do
      if ! kill -0 "$builds" 2>/dev/null; then
        sleep 1; [ -e "$state/$p.ok" ] || [ -e "$state/$p.failed" ] || { echo "run_tests: the builder ended before $p" >&2; return 1; }
      fi
      sleep 5
    done
    if [ -e "$state/$p.failed" ]; then
      echo "run_tests: the build of $p failed ($log):" >&2
      sed -n "/^building $p /,\$p" "$log" | tail -n 40 >&2
      return 1
    fi
  done
}

status=0
record() { [ "$status" -ne 0 ] || status=$1; }
# group NAME "PROGRAMS" PYTEST-ARGUMENTS...: runs pytest once the programs (none: at once) are built.
group() {
  local name=$1 needs=$2 start rc
  shift 2
  [ -z "$needs" ] || echo "run_tests: $name: waiting for $needs ($(elapsed))"
  if ! ready $needs; then
    echo "run_tests: $name: not run (a program it needs did not build)" >&2
    record 1; return
  fi
  echo "run_tests: $name: starting ($(elapsed))"
  start=$(date +%s)
  "$pytest" --durations=15 "$@" "${extra[@]}"
  rc=$?
  echo "run_tests: $name ended with $rc after $(( $(date +%s) - start )) s ($(elapsed))"
  record "$rc"
}

extra=("$@")
group "phase 1 (no Go program)" "" --ignore=tests/cluster --ignore=tests/nvidia
group nvidia "mig-parted k8s-device-plugin" tests/nvidia
ignore=()
for g in "${CLUSTER_GROUPS[@]}"; do
  for f in ${g##*|}; do ignore+=("--ignore=$f"); done
done
group control-plane "$control_plane" tests/cluster "${ignore[@]}"
for g in "${CLUSTER_GROUPS[@]}"; do
  IFS='|' read -r name needs files <<<"$g"
  # shellcheck disable=SC2086 # the file list splits into arguments
  group "$name" "$needs" $files
done

if [ -n "$builds" ]; then
  wait "$builds"; builds=
  grep -E '^(built|FAILED)' "$log" || true
  [ -z "$(ls "$state"/*.failed 2>/dev/null)" ] || record 1
fi
exit "$status"
