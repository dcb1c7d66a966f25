/// Events due from a device producing `ratePerSecond` events: the integral of the rate since
/// `startMs`, less what was already handed out, so rounding never drifts (2.5 events/s gives 5
/// every 2 s) and a late tick catches up. A value type: time comes only from arguments.
struct RatePacer: Equatable {
    let ratePerSecond: Double
    let startMs: Int64
    private(set) var emitted: Int64 = 0

    init(ratePerSecond: Double, startMs: Int64) {
        self.ratePerSecond = max(0, ratePerSecond)
        self.startMs = startMs
    }

    /// How many events became due by `nowMs` since the last call.
    mutating func due(nowMs: Int64) -> Int64 {
        guard nowMs > startMs else { return 0 }
        let target = Int64((ratePerSecond * Double(nowMs - startMs) / 1000).rounded(.down))
        let n = max(0, target - emitted)
        emitted += n
        return n
    }
}

/// Starts at most `perSecond` things per second (the connect ramp): the count allowed by
/// `nowMs`, less those already started. A value type.
struct Ramp: Equatable {
    let perSecond: Double
    let startMs: Int64
    private(set) var started = 0

    /// How many may start now, at most `remaining`.
    mutating func take(nowMs: Int64, remaining: Int) -> Int {
        let allowed = Int((perSecond * Double(max(0, nowMs - startMs)) / 1000).rounded(.down)) + 1
        let n = max(0, min(remaining, allowed - started))
        started += n
        return n
    }
}
