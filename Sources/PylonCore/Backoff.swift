/// Exponential backoff, the one rule every retry in Pylon uses (supervisor restarts, uploader
/// sends, MA backend calls, push redelivery, MQTT reconnects).
///
/// `delay(attempt:)` is pure: attempt 1 waits `initialMs`, each further attempt multiplies by
/// `multiplier`, capped at `maxMs`, then spread by ±`jitter` (still capped). The jitter draw is
/// passed in (`random` in [0, 1)), so callers and tests decide where randomness comes from.
public struct BackoffPolicy: Sendable, Equatable {
    public var initialMs: UInt64
    public var maxMs: UInt64
    public var multiplier: Double
    public var jitter: Double

    public init(initialMs: UInt64, maxMs: UInt64, multiplier: Double = 2, jitter: Double = 0) {
        self.initialMs = initialMs
        self.maxMs = max(initialMs, maxMs)
        self.multiplier = max(1, multiplier)
        self.jitter = min(max(0, jitter), 1)
    }

    /// The wait before retry number `attempt` (1-based; 0 or less is treated as 1).
    public func delay(attempt: Int, random: Double = 0.5) -> UInt64 {
        var base = Double(initialMs)
        var i = 1
        let cap = Double(maxMs)
        while i < attempt && base < cap {
            base *= multiplier
            i += 1
        }
        base = min(base, cap)
        let spread = base * (1 + jitter * (2 * random - 1))
        return UInt64(max(0, min(spread, cap)).rounded())
    }
}

/// A `BackoffPolicy` with its attempt count and a deterministic jitter source: `next()` returns the
/// next delay and counts the attempt, `reset()` after a success.
public struct Backoff: Sendable {
    public let policy: BackoffPolicy
    public private(set) var attempt = 0
    private var rng: SplitMix64

    public init(_ policy: BackoffPolicy, seed: UInt64 = 0x9E37) {
        self.policy = policy
        rng = SplitMix64(seed: seed)
    }

    public init(initialMs: UInt64, maxMs: UInt64, jitter: Double = 0.2, seed: UInt64 = 0x9E37) {
        self.init(BackoffPolicy(initialMs: max(1, initialMs), maxMs: maxMs, jitter: jitter), seed: seed)
    }

    /// The next delay (ms), at least 1, and one more attempt counted.
    public mutating func next() -> UInt64 {
        attempt += 1
        return max(1, policy.delay(attempt: attempt, random: rng.nextUnit()))
    }

    public mutating func reset() { attempt = 0 }
}
