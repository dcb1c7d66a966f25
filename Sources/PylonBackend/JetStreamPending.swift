/// The publishes waiting for their JetStream acknowledgement: a value type fed with the loop's
/// clock (ms), so the publisher arms one timer for `nextWake` and nothing polls.
///
/// Each publish gets a token (the last token of its reply subject). An entry is *in flight*
/// until its ack arrives or its deadline (`ackTimeoutMs`) passes; then it is *late*: its
/// request was answered 503, but an ack that still arrives within `lateAckMs` is delivered
/// (the batch is in the stream, so its key must be recorded). All entries share one timeout, so
/// deadlines come in publish order and two cursors over `order` find the next expiry and the
/// next entry to forget.
///
/// Bounds: at most `maxInFlight` in flight (`add` returns nil: 503) and `maxTotal` entries in
/// all (the oldest late ones are forgotten first).
struct PendingPublishes<Payload> {
    struct Entry {
        var deadline: UInt64
        var timedOut = false
        var payload: Payload
    }

    let maxInFlight: Int
    let maxTotal: Int
    let ackTimeoutMs: UInt64
    let lateAckMs: UInt64
    private(set) var entries: [UInt64: Entry] = [:]
    private(set) var inFlight = 0
    /// Tokens in publish order; acked entries stay here until a cursor passes them.
    private var order: [UInt64] = []
    /// The first entry of `order` that may still be in flight.
    private var expireCursor = 0
    /// The first entry of `order` that may still be in `entries`.
    private var forgetCursor = 0
    private var nextToken: UInt64 = 1

    init(maxInFlight: Int, ackTimeoutMs: UInt64, lateAckMs: UInt64) {
        self.maxInFlight = maxInFlight
        self.maxTotal = 2 * maxInFlight
        self.ackTimeoutMs = ackTimeoutMs
        self.lateAckMs = lateAckMs
    }

    var isFull: Bool { inFlight >= maxInFlight }

    /// A new in-flight entry and its token, or nil when `maxInFlight` are in flight.
    mutating func add(_ payload: Payload, now: UInt64) -> UInt64? {
        guard !isFull else { return nil }
        while entries.count >= maxTotal, forgetCursor < expireCursor {
            entries[order[forgetCursor]] = nil
            forgetCursor += 1
        }
        let token = nextToken
        nextToken += 1
        entries[token] = Entry(deadline: now + ackTimeoutMs, payload: payload)
        order.append(token)
        inFlight += 1
        compact()
        return token
    }

    /// The ack for `token` arrived: its payload and whether it was late; nil for a token not
    /// (or no longer) pending.
    mutating func resolve(_ token: UInt64) -> (payload: Payload, late: Bool)? {
        guard let e = entries.removeValue(forKey: token) else { return nil }
        if !e.timedOut { inFlight -= 1 }
        skipResolved()
        return (e.payload, e.timedOut)
    }

    /// Marks every entry whose deadline passed as late (returning their payloads, in publish
    /// order) and forgets late entries older than `lateAckMs`.
    mutating func expire(now: UInt64) -> [Payload] {
        var out: [Payload] = []
        while expireCursor < order.count {
            let t = order[expireCursor]
            if var e = entries[t] {
                guard e.deadline <= now else { break }
                e.timedOut = true
                entries[t] = e
                inFlight -= 1
                out.append(e.payload)
            }
            expireCursor += 1
        }
        while forgetCursor < expireCursor {
            let t = order[forgetCursor]
            if let e = entries[t] {
                guard e.deadline + lateAckMs <= now else { break }
                entries[t] = nil
            }
            forgetCursor += 1
        }
        skipResolved()
        compact()
        return out
    }

    /// The connection was lost: no ack for an entry in flight can come any more on it (the
    /// server sent it to the old connection, or never got the publish). Every one is made late
    /// now (returned in publish order), as if its deadline were `now`.
    mutating func expireAll(now: UInt64) -> [Payload] {
        for i in expireCursor..<order.count {
            if var e = entries[order[i]] {
                e.deadline = min(e.deadline, now)
                entries[order[i]] = e
            }
        }
        return expire(now: now)
    }

    /// When `expire` has something to do next, or nil when nothing is pending.
    var nextWake: UInt64? {
        var wake: UInt64?
        if expireCursor < order.count, let e = entries[order[expireCursor]] { wake = e.deadline }
        if forgetCursor < expireCursor, let e = entries[order[forgetCursor]] {
            let f = e.deadline + lateAckMs
            wake = wake.map { min($0, f) } ?? f
        }
        return wake
    }

    /// Moves both cursors past resolved entries (amortised: each token is passed once), so
    /// each cursor rests on a pending entry or at its end.
    private mutating func skipResolved() {
        while forgetCursor < expireCursor, entries[order[forgetCursor]] == nil { forgetCursor += 1 }
        while expireCursor < order.count, entries[order[expireCursor]] == nil { expireCursor += 1 }
        if forgetCursor == expireCursor {
            while forgetCursor < order.count, entries[order[forgetCursor]] == nil { forgetCursor += 1 }
            expireCursor = max(expireCursor, forgetCursor)
        }
    }

    /// Drops the passed prefix of `order` once it is most of the array.
    private mutating func compact() {
        guard forgetCursor > 1024, forgetCursor * 2 > order.count else { return }
        order.removeFirst(forgetCursor)
        expireCursor -= forgetCursor
        forgetCursor = 0
    }
}
