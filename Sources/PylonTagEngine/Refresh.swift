/// Refresh timing of one container, as the legacy SDK had it. Value types with the time
/// passed in (milliseconds), so tests need no sleeps.
public enum RefreshTiming {
    /// A saved container older than this is stale; after a network success the next automatic
    /// refresh is this much later.
    public static let staleAfterMs: Int64 = 12 * 3_600_000
    /// After a network failure the next attempt is this much later.
    public static let retryAfterFailureMs: Int64 = 3_600_000

    /// Delay until the next automatic network load.
    public enum Event: Equatable, Sendable {
        case networkSuccess
        case networkFailure
        /// A saved container adopted at start, fetched at `savedAtMs`.
        case adoptedSaved(savedAtMs: Int64)
    }

    public static func nextLoadDelayMs(after e: Event, nowMs: Int64, periodMs: Int64 = staleAfterMs) -> Int64 {
        switch e {
        case .networkSuccess: return periodMs
        case .networkFailure: return retryAfterFailureMs
        case .adoptedSaved(let saved): return max(0, min(periodMs, saved + periodMs - nowMs))
        }
    }

    public static func isStale(fetchedAtMs: Int64, nowMs: Int64, periodMs: Int64 = staleAfterMs) -> Bool {
        nowMs - fetchedAtMs >= periodMs
    }
}

/// The manual-refresh limit: a bucket of `capacity` tokens, one more every `refillMs`, and a
/// call within `minSpacingMs` of the last accepted one is ignored.
public struct RefreshRateLimiter: Sendable, Equatable {
    public static let defaultCapacity = 30
    public static let defaultRefillMs: Int64 = 15 * 60_000
    public static let defaultMinSpacingMs: Int64 = 5_000

    public let capacity: Int
    public let refillMs: Int64
    public let minSpacingMs: Int64
    public private(set) var tokens: Int
    /// When the bucket last gained (or started counting toward) a token.
    private var refillAnchorMs: Int64?
    public private(set) var lastAcceptedMs: Int64?

    public init(capacity: Int = defaultCapacity, refillMs: Int64 = defaultRefillMs, minSpacingMs: Int64 = defaultMinSpacingMs) {
        self.capacity = capacity
        self.refillMs = refillMs
        self.minSpacingMs = minSpacingMs
        tokens = capacity
    }

    public enum Decision: Equatable, Sendable {
        case accepted
        case tooSoon(retryInMs: Int64)
        case noTokens(retryInMs: Int64)

        /// The caller-facing reason (nil when accepted).
        public var reason: String? {
            switch self {
            case .accepted: return nil
            case .tooSoon: return "rate_limited: called within 5 s of the last accepted refresh"
            case .noTokens: return "rate_limited: no refresh tokens left (one more every 15 minutes)"
            }
        }
    }

    public mutating func request(nowMs: Int64) -> Decision {
        refill(nowMs)
        if let last = lastAcceptedMs, nowMs - last < minSpacingMs {
            return .tooSoon(retryInMs: minSpacingMs - (nowMs - last))
        }
        guard tokens > 0 else {
            let anchor = refillAnchorMs ?? nowMs
            return .noTokens(retryInMs: max(0, anchor + refillMs - nowMs))
        }
        if tokens == capacity { refillAnchorMs = nowMs }
        tokens -= 1
        lastAcceptedMs = nowMs
        return .accepted
    }

    private mutating func refill(_ now: Int64) {
        guard tokens < capacity, let anchor = refillAnchorMs, now > anchor else { return }
        let gained = (now - anchor) / refillMs
        guard gained > 0 else { return }
        tokens = min(capacity, tokens + Int(clamping: gained))
        refillAnchorMs = anchor + gained * refillMs
    }
}

/// How `gtm.openContainer` waits.
public enum OpenType: String, Sendable, CaseIterable {
    case preferNonDefault = "prefer_non_default"
    case preferFresh = "prefer_fresh"
    /// The SDK's low-level open: return at once.
    case lowLevel = "default"
}

public enum RefreshKind: String, Sendable { case saved, network }

/// A lifecycle event of a container, as the callbacks reported it.
public enum RefreshEvent: Equatable, Sendable {
    case begin(RefreshKind)
    /// `lastRefreshMs`: the fetch time of the container now in use.
    case success(RefreshKind, lastRefreshMs: Int64)
    case failure(RefreshKind, reason: String)
}

/// The opener's release rule: whether `event` lets a caller waiting with `type` since
/// `startMs` have the container now.
public enum OpenerRule {
    public static let defaultTimeoutMs: Int64 = 2_000
    public static let minTimeoutMs: Int64 = 1

    public static func releases(_ type: OpenType, _ event: RefreshEvent, startMs: Int64) -> Bool {
        switch (type, event) {
        case (.lowLevel, _): return true
        case (_, .begin): return false
        case (.preferNonDefault, .success): return true
        case (.preferNonDefault, .failure(.network, _)): return true
        case (.preferNonDefault, .failure(.saved, _)): return false
        case (.preferFresh, .success(.network, _)): return true
        case (.preferFresh, .success(.saved, let last)): return last > startMs - RefreshTiming.staleAfterMs
        case (.preferFresh, .failure(.network, _)): return true
        case (.preferFresh, .failure(.saved, _)): return false
        }
    }

    /// The timeout clamped to at least 1 ms (default 2000 ms).
    public static func timeout(_ ms: Int64?) -> Int64 { max(minTimeoutMs, ms ?? defaultTimeoutMs) }
}

/// A preview URL: `tagmanager.c.<app id>://preview/p?id=<id>&gtm_auth=<token>&gtm_preview=<n>[&gtm_debug=x]`
/// enters preview; the same with an empty `gtm_preview=` leaves it.
public enum PreviewURL: Equatable, Sendable {
    case enter(containerId: String, auth: String, preview: String, debug: Bool)
    case exit(containerId: String)

    public static func parse(_ raw: String) -> PreviewURL? {
        let url = percentDecode(raw) ?? raw
        guard url.hasPrefix("tagmanager.c."), let sep = url.range(of: "://preview/p?") else { return nil }
        let app = url[url.index(url.startIndex, offsetBy: "tagmanager.c.".count)..<sep.lowerBound]
        guard !app.isEmpty, !app.contains(where: \.isWhitespace) else { return nil }
        let query = url[sep.upperBound...]
        guard !query.contains(where: \.isWhitespace) else { return nil }
        var pairs: [(String, String)] = []
        for part in query.split(separator: "&", omittingEmptySubsequences: false) {
            guard let eq = part.firstIndex(of: "=") else { return nil }
            pairs.append((String(part[..<eq]), String(part[part.index(after: eq)...])))
        }
        let keys = pairs.map(\.0)
        func v(_ k: String) -> String? { pairs.first { $0.0 == k }?.1 }
        guard let id = v("id"), !id.isEmpty, keys.first == "id" else { return nil }
        if keys == ["id", "gtm_preview"], v("gtm_preview") == "" { return .exit(containerId: id) }
        if keys == ["id", "gtm_auth", "gtm_preview"] || keys == ["id", "gtm_auth", "gtm_preview", "gtm_debug"] {
            guard let auth = v("gtm_auth"), !auth.isEmpty, let p = v("gtm_preview") else { return nil }
            if p.isEmpty { return .exit(containerId: id) }
            guard p.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
            let debug = keys.count == 4
            if debug && v("gtm_debug") != "x" { return nil }
            return .enter(containerId: id, auth: auth, preview: p, debug: debug)
        }
        return nil
    }

    static func percentDecode(_ s: String) -> String? {
        var out = [UInt8]()
        let u = Array(s.utf8)
        var i = 0
        while i < u.count {
            if u[i] == 0x25 {
                guard i + 2 < u.count, let b = Digest.fromHex(String(decoding: u[i + 1...i + 2], as: UTF8.self)) else { return nil }
                out += b
                i += 3
            } else {
                out.append(u[i])
                i += 1
            }
        }
        return String(validating: out, as: UTF8.self)
    }
}
