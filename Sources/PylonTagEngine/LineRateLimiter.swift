/// A token bucket for log lines (one per owner in the gtm plugin): `burst` lines at once, then
/// `perSecond`. A suppressed line is counted; the next line let through reports the count, so
/// a flood of one warning (a 15 KB container id asked for thousands of times a second) costs a
/// line a second, not megabytes.
public struct LineRateLimiter: Sendable, Equatable {
    public let burst: Double
    public let perSecond: Double
    public private(set) var tokens: Double
    public private(set) var lastMs: Int64?
    /// Lines suppressed since the last one let through.
    public private(set) var suppressed = 0
    /// Lines suppressed in all.
    public private(set) var totalSuppressed = 0

    public init(burst: Int, perSecond: Int) {
        self.burst = Double(max(1, burst))
        self.perSecond = Double(max(1, perSecond))
        tokens = self.burst
    }

    public enum Decision: Equatable, Sendable {
        /// Emit the line; `suppressedBefore` lines were dropped since the last one emitted.
        case emit(suppressedBefore: Int)
        case suppress
    }

    public mutating func request(nowMs: Int64) -> Decision {
        if let last = lastMs, nowMs > last {
            tokens = min(burst, tokens + Double(nowMs - last) * perSecond / 1000)
        }
        if lastMs == nil || nowMs > lastMs! { lastMs = nowMs }
        guard tokens >= 1 else {
            suppressed += 1
            totalSuppressed += 1
            return .suppress
        }
        tokens -= 1
        let n = suppressed
        suppressed = 0
        return .emit(suppressedBefore: n)
    }
}
