import Foundation

/// How many random inputs a property test draws. The full count (`make test`, CI) when
/// `PYLON_PROPERTY_RUNS=full`; a quarter of it otherwise (at least 250), so `make test-unit`, the
/// inner loop, stays fast (docs/TESTING.md). The inputs are the first of the same seeded
/// sequence either way: a failure found by the quick run is found by the full one.
public enum PropertyRuns {
    public static let full = ProcessInfo.processInfo.environment["PYLON_PROPERTY_RUNS"] == "full"

    public static func count(_ fullCount: Int) -> Int { full ? fullCount : max(fullCount / 4, min(fullCount, 250)) }

    /// `n` of `fullCount` inputs, scaled to the inputs drawn: a coverage floor ("at least 1,500 of
    /// 8,000 valid") that holds for the quick run too.
    public static func share(_ n: Int, of fullCount: Int) -> Int { n * count(fullCount) / fullCount }
}
