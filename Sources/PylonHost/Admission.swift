import PylonCore
import PylonProtocol

/// Admission of client connections as a value: the connection limit, the per-uid limit (so one
/// local user cannot take every slot), each uid's connections (the per-uid queue bound sums their
/// queued bytes), and the throttle of the refusal log (at most one line per `refusalLogMs`: the
/// first refusal after a quiet period at once, the rest summed at the end of the window).
///
/// No I/O and no clock: `Bus` asks `decide`, records what it adopted and closed, and performs the
/// returned log actions with its loop time and one timer. `Member` is the shell's connection
/// object (`Peer`); tests use any class. Unit-tested in AdmissionTests.
struct Admission<Member: AnyObject> {
    /// The refusal log's window.
    static var refusalLogMs: UInt64 { 10_000 }

    /// Connected clients.
    private(set) var count = 0
    /// Each uid's connections, in the order they were adopted.
    private(set) var byUid: [UInt32: [Member]] = [:]
    /// Connections refused since start.
    private(set) var refusedTotal: UInt64 = 0
    /// Refused connections not yet reported, by limit name.
    private var unlogged: [String: Int] = [:]
    private var lastLogMs: UInt64?
    /// A summary is due at the end of the current window (the shell's timer is armed).
    private(set) var logPending = false

    enum Verdict: Equatable {
        case accept
        /// Refused under `limit` (a config name, or `shuttingDown`), with the one error line the
        /// connection gets.
        case refuse(limit: String, RPCError)
    }

    /// One log line: refusals since the last line, by limit (`name=count,…`, sorted), and in all.
    struct Summary: Equatable {
        var count: Int
        var byLimit: String
        var total: UInt64
    }

    enum LogAction: Equatable {
        /// Nothing now (a summary is already due).
        case none
        case logNow(Summary)
        /// Arm the timer for `afterMs`; call `logTimerFired` then.
        case logAfter(ms: UInt64)
    }

    /// Whether a client connecting with `uid` (nil: credentials unknown, no per-uid count) is
    /// adopted under `limits`.
    func decide(uid: UInt32?, shuttingDown: Bool, limits: Limits) -> Verdict {
        if shuttingDown { return .refuse(limit: "shuttingDown", RPCError(.shuttingDown, "host is shutting down")) }
        if count >= limits.maxConnections {
            return .refuse(
                limit: "maxConnections",
                RPCError(
                    .overloaded, "too many connections (limit \(limits.maxConnections))",
                    data: ["limit": "maxConnections", "value": .int(Int64(limits.maxConnections))]))
        }
        if let uid, byUid[uid, default: []].count >= limits.maxConnectionsPerUid {
            return .refuse(
                limit: "maxConnectionsPerUid",
                RPCError(
                    .overloaded, "too many connections from uid \(uid) (limit \(limits.maxConnectionsPerUid))",
                    data: ["limit": "maxConnectionsPerUid", "value": .int(Int64(limits.maxConnectionsPerUid))]))
        }
        return .accept
    }

    mutating func admit(_ member: Member, uid: UInt32?) {
        count += 1
        if let uid { byUid[uid, default: []].append(member) }
    }

    mutating func remove(_ member: Member, uid: UInt32?) {
        count -= 1
        guard let uid else { return }
        var same = byUid[uid, default: []]
        same.removeAll { $0 === member }
        byUid[uid] = same.isEmpty ? nil : same
    }

    /// The connections of `uid`.
    func members(ofUid uid: UInt32) -> [Member] { byUid[uid, default: []] }

    /// The connections of `uid` to disconnect so that what the host holds for them together
    /// (`held`: output not yet read, replies gathered in open batches) is back within `limit`
    /// (`maxQueuedBytesPerUid`): those holding the most first (the earlier adopted of equals). A
    /// connection that reads its replies holds next to nothing, so its siblings that do not read
    /// go before it; one holding nothing is never named. Empty while the uid is within `limit`.
    func evictions(ofUid uid: UInt32, limit: Int, held: (Member) -> Int) -> [Member] {
        let same = byUid[uid, default: []]
        let sizes = same.map(held)
        var total = sizes.reduce(0, +)
        guard total > limit else { return [] }
        var out: [Member] = []
        for i in same.indices.sorted(by: { sizes[$0] != sizes[$1] ? sizes[$0] > sizes[$1] : $0 < $1 }) where sizes[i] > 0 {
            out.append(same[i])
            total -= sizes[i]
            if total <= limit { break }
        }
        return out
    }

    /// Counts a refusal under `limit` at `nowMs`: log now, or arm the timer for the window's end.
    mutating func refused(_ limit: String, nowMs: UInt64) -> LogAction {
        refusedTotal += 1
        unlogged[limit, default: 0] += 1
        guard !logPending else { return .none }
        let wait = lastLogMs.map { $0 + Self.refusalLogMs > nowMs ? $0 + Self.refusalLogMs - nowMs : 0 } ?? 0
        if wait == 0 { return takeSummary(nowMs: nowMs).map { .logNow($0) } ?? .none }
        logPending = true
        return .logAfter(ms: wait)
    }

    /// The window ended: the summary to log, if anything was refused in it.
    mutating func logTimerFired(nowMs: UInt64) -> Summary? {
        logPending = false
        return takeSummary(nowMs: nowMs)
    }

    private mutating func takeSummary(nowMs: UInt64) -> Summary? {
        guard !unlogged.isEmpty else { return nil }
        let byLimit = unlogged.keys.sorted().map { "\($0)=\(unlogged[$0]!)" }.joined(separator: ",")
        let n = unlogged.values.reduce(0, +)
        unlogged = [:]
        lastLogMs = nowMs
        return Summary(count: n, byLimit: byLimit, total: refusedTotal)
    }
}
