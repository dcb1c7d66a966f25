#!/bin/sh
# The tag engine's worst cases, timed: the upper bounds the unit tests used to assert on the wall
# clock (issue 38 item 5) and now leave to this script, run by hand.
#
#   Benchmarks/engine-worst-cases.sh [--skip-build]
#
# Runs the three tests that carry the engine's worst cases (debug build, as `swift test` runs
# them) one at a time and prints each one's time against its former bound:
#   RuleTests/workLimitStopsExponentialTemplates   a macro chain of 2^30 expansions   2 s
#   PredicateTests/catastrophicRegexGivesUpQuickly  two catastrophic regexes          1 s
#   PropertyTests/randomContainersNeverCrashOrHang  400 random containers evaluated   60 s
# The tests themselves check what bounds the work (the evaluation cache, PCRE2's match limit,
# the step budget); a time over its bound here means that work got slower, not unbounded.
# Exits 1 if a test fails or takes longer than its bound.
set -eu
cd "$(dirname "$0")/.."
[ "${1:-}" = "--skip-build" ] || swift build --build-tests >/dev/null
status=0
for case in \
    "RuleTests/workLimitStopsExponentialTemplates 2" \
    "PredicateTests/catastrophicRegexGivesUpQuickly 1" \
    "PropertyTests/randomContainersNeverCrashOrHang 60"; do
    set -- $case
    test=$1 bound=$2
    out=$(swift test --skip-build --filter "TagEngineTests.$test" 2>&1) || { echo "$out"; status=1; continue; }
    # Swift Testing: "✔ Test name() passed after 0.123 seconds."
    secs=$(echo "$out" | sed -n "s/.*Test ${test#*/}() passed after \([0-9.]*\) seconds.*/\1/p" | head -n 1)
    if [ -z "$secs" ]; then
        echo "$test: no time in the output"
        echo "$out"
        status=1
        continue
    fi
    verdict=$(awk -v s="$secs" -v b="$bound" 'BEGIN { print (s + 0 <= b + 0) ? "ok" : "OVER" }')
    printf '%-52s %8.3f s  (bound %s s)  %s\n' "$test" "$secs" "$bound" "$verdict"
    [ "$verdict" = ok ] || status=1
done
exit $status
