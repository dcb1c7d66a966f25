import PylonCore

/// Delivery, acknowledgement, redelivery, expiry and the inbox bounds, as a value type.
///
/// It takes events (a stored message, an app attaching or leaving, a callback's outcome, the
/// clock) and returns `Action`s that the shell performs (call the app's callback, delete an
/// acknowledged or dropped message from SQLite, arm the timer). It holds no I/O and reads time
/// only from its arguments, so tests drive it with a fake clock.
///
/// Rules: each message goes to the one client attached for its app; a success reply acknowledges
/// it (deleted, never delivered again); an error, a timeout or the client leaving leaves it
/// unacknowledged, to be delivered again after `retryDelay(attempts)`. Messages for apps not
/// attached wait (`coldStart` when finally delivered). At most `maxInFlightPerApp` callbacks per
/// app are outstanding. Past `expiresAt` a message is dropped (counted `expired`). Over
/// `maxCount` or `maxBytes` the oldest message not in flight is dropped first (counted `dropped`).
struct Delivery {
    struct Limits: Equatable {
        var maxCount = 10_000
        var maxBytes = 8 << 20
        var maxInFlightPerApp = 256
        var ackTimeoutMs: Int64 = 30_000
        var retryInitialMs: Int64 = 500
        var retryMaxMs: Int64 = 60_000
    }

    struct Entry: Equatable {
        var id: String
        var appId: String
        var seq: Int64
        var bytes: Int
        var expiresAt: Int64
        var attempts: Int
        /// Stored while its app was not attached.
        var cold: Bool
        var inFlightUntil: Int64?
        var notBefore: Int64 = 0
    }

    enum Action: Equatable {
        case deliver(id: String, appId: String, client: Int64, coldStart: Bool, attempt: Int)
        /// Acknowledged: delete and report the ack.
        case acked(id: String, appId: String)
        /// Removed without delivery (expired, or evicted by the bounds).
        case discard(id: String, reason: Reason)
    }
    enum Reason: String, Equatable { case expired, dropped }

    struct Counters: Equatable {
        var delivered = 0, acknowledged = 0, expired = 0, dropped = 0, failed = 0, redelivered = 0
    }

    let limits: Limits
    private(set) var entries: [String: Entry] = [:]
    private(set) var attached: [String: Int64] = [:]
    private(set) var bytes = 0
    private(set) var counters = Counters()
    private var inFlight: [String: Int] = [:]

    init(limits: Limits) { self.limits = limits }

    var count: Int { entries.count }

    /// A message restored from SQLite after a restart (unacknowledged: delivered again, after the
    /// backoff its earlier attempts earned).
    mutating func restore(_ e: Entry, now: Int64) {
        var e = e
        e.inFlightUntil = nil
        e.notBefore = now + retryDelay(max(e.attempts, 1))
        entries[e.id] = e
        bytes += e.bytes
    }

    func retryDelay(_ attempts: Int) -> Int64 {
        guard attempts > 0 else { return 0 }
        return Int64(
            BackoffPolicy(initialMs: UInt64(max(0, limits.retryInitialMs)), maxMs: UInt64(max(0, limits.retryMaxMs)))
                .delay(attempt: attempts))
    }

    /// A new message (already persisted by the shell). `cold` is decided here.
    mutating func received(id: String, appId: String, seq: Int64, bytes n: Int, expiresAt: Int64, now: Int64) -> [Action] {
        var out: [Action] = []
        if expiresAt <= now {
            counters.expired += 1
            return [.discard(id: id, reason: .expired)]
        }
        entries[id] = Entry(id: id, appId: appId, seq: seq, bytes: n, expiresAt: expiresAt, attempts: 0, cold: attached[appId] == nil)
        bytes += n
        out += enforceBounds(keeping: id)
        out += pump(appId, now: now)
        return out
    }

    mutating func attach(appId: String, client: Int64, now: Int64) -> [Action] {
        attached[appId] = client
        return pump(appId, now: now)
    }

    /// The app detached (or its client closed): its in-flight messages stay unacknowledged.
    mutating func detach(appId: String) {
        attached[appId] = nil
        for (id, e) in entries where e.appId == appId && e.inFlightUntil != nil { unflight(id, failed: false) }
    }

    mutating func clientClosed(_ client: Int64) -> [String] {
        let apps = attached.filter { $0.value == client }.map(\.key)
        for a in apps { detach(appId: a) }
        return apps
    }

    /// The callback's outcome. A success is the acknowledgement even if it arrives late.
    mutating func callbackResult(id: String, ok: Bool, now: Int64) -> [Action] {
        guard let e = entries[id] else { return [] }
        if ok {
            if e.inFlightUntil != nil { inFlight[e.appId, default: 1] -= 1 }
            entries[id] = nil
            bytes -= e.bytes
            counters.acknowledged += 1
            return [.acked(id: id, appId: e.appId)] + pump(e.appId, now: now)
        }
        guard e.inFlightUntil != nil else { return [] }  // already timed out
        unflight(id, failed: true, now: now)
        return pump(e.appId, now: now)
    }

    /// Expiry, callback timeouts and due retries.
    mutating func tick(now: Int64) -> [Action] {
        var out: [Action] = []
        var apps = Set<String>()
        for (id, e) in entries {
            if e.expiresAt <= now && e.inFlightUntil == nil {
                entries[id] = nil
                bytes -= e.bytes
                counters.expired += 1
                out.append(.discard(id: id, reason: .expired))
            } else if let t = e.inFlightUntil, t <= now {
                unflight(id, failed: true, now: now)
                apps.insert(e.appId)
            } else if e.notBefore <= now && e.inFlightUntil == nil {
                apps.insert(e.appId)
            }
        }
        for a in apps.sorted() { out += pump(a, now: now) }
        return out
    }

    /// When `tick` next has something to do (nil: nothing pending).
    func nextDeadline() -> Int64? {
        var best: Int64?
        func consider(_ t: Int64) { best = best.map { min($0, t) } ?? t }
        for e in entries.values {
            if let t = e.inFlightUntil { consider(t); continue }
            consider(e.expiresAt)
            if e.notBefore > 0, attached[e.appId] != nil { consider(e.notBefore) }
        }
        return best
    }

    // MARK: Internals

    private mutating func unflight(_ id: String, failed: Bool, now: Int64 = 0) {
        guard var e = entries[id], e.inFlightUntil != nil else { return }
        e.inFlightUntil = nil
        inFlight[e.appId, default: 1] -= 1
        if failed {
            counters.failed += 1
            e.notBefore = now + retryDelay(max(e.attempts, 1))
        }
        entries[id] = e
    }

    /// Delivers what is due for `appId`, oldest first, up to the in-flight bound.
    private mutating func pump(_ appId: String, now: Int64) -> [Action] {
        guard let client = attached[appId] else { return [] }
        var room = limits.maxInFlightPerApp - inFlight[appId, default: 0]
        guard room > 0 else { return [] }
        let due = entries.values.filter { $0.appId == appId && $0.inFlightUntil == nil && $0.notBefore <= now && $0.expiresAt > now }
            .sorted { $0.seq < $1.seq }
        var out: [Action] = []
        for var e in due where room > 0 {
            room -= 1
            if e.attempts > 0 { counters.redelivered += 1 }
            e.attempts += 1
            e.inFlightUntil = now + limits.ackTimeoutMs
            entries[e.id] = e
            inFlight[appId, default: 0] += 1
            counters.delivered += 1
            out.append(.deliver(id: e.id, appId: appId, client: client, coldStart: e.cold, attempt: e.attempts))
        }
        return out
    }

    /// Drops the oldest messages not in flight (never `keeping`) until within the bounds.
    private mutating func enforceBounds(keeping: String) -> [Action] {
        var out: [Action] = []
        guard entries.count > limits.maxCount || bytes > limits.maxBytes else { return out }
        let victims = entries.values.filter { $0.inFlightUntil == nil && $0.id != keeping }.sorted { $0.seq < $1.seq }
        for v in victims {
            guard entries.count > limits.maxCount || bytes > limits.maxBytes else { break }
            entries[v.id] = nil
            bytes -= v.bytes
            counters.dropped += 1
            out.append(.discard(id: v.id, reason: .dropped))
        }
        return out
    }
}
