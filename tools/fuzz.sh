#!/usr/bin/env bash
# Runs each libFuzzer target for FUZZ_SECONDS (default 60), or until FUZZ_RUNS inputs when that is
# set and comes first (a quick check: FUZZ_RUNS=20000), and prints executions and findings.
# Used by `make fuzz` after the fuzz build (.build-fuzz). Seeds: Fuzz/corpus/<target> (read
# only); what a run discovers goes to .fuzz-work/<target>/corpus, crash artifacts to
# .fuzz-work/<target>/artifacts (both ignored by git). Exit status 1 if any target found
# something.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${FUZZ_BIN:-.build-fuzz/release}
SECONDS_EACH=${FUZZ_SECONDS:-60}
RUNS=${FUZZ_RUNS:-}
TARGETS=${FUZZ_TARGETS:-message manifest backend-http ma uploader segment}
export SWIFT_BACKTRACE=enable=no   # a trap goes straight to libFuzzer, which saves the input
found=0
printf '%-14s %12s %10s %10s %s\n' target executions exec/s new-units findings
for t in $TARGETS; do
    work=.fuzz-work/$t
    mkdir -p "$work/corpus" "$work/artifacts"
    before=$(ls "$work/artifacts" | sort)
    extra=()
    if [ -n "$RUNS" ]; then extra+=(-runs="$RUNS"); fi
    asan=${ASAN_OPTIONS:-}
    if [ "$t" = backend-http ]; then
        # Swift keeps weak-reference side tables behind tagged pointers that LeakSanitizer
        # cannot follow (the backend's `[weak self]` timers): leak checks report them falsely.
        extra+=(-detect_leaks=0)
        asan=detect_leaks=0
    fi
    ASAN_OPTIONS=$asan "$BIN/fuzz-$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${extra[@]}" \
        "$work/corpus" "Fuzz/corpus/$t" >"$work/last.log" 2>&1 &
    pid=$!
    wait $pid
    rc=$?
    rm -f /tmp/pylon-fuzz-backend-$pid.db /tmp/pylon-fuzz-backend-$pid.db-wal /tmp/pylon-fuzz-backend-$pid.db-shm
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/last.log" | tail -1)
    news=$(sed -n 's/^stat::new_units_added: *//p' "$work/last.log" | tail -1)
    new=$(comm -13 <(echo "$before") <(ls "$work/artifacts" | sort) | grep -v '^$')
    verdict="none"
    if [ $rc -ne 0 ] || [ -n "$new" ]; then
        verdict="FOUND (exit $rc): $(echo $new | head -c 200) see $work/last.log"
        found=1
    fi
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/last.log" | tail -1)
    printf '%-14s %12s %10s %10s %s\n' "$t" "${execs:-?}" "${rate:-?}" "${news:-?}" "$verdict"
done
exit $found
