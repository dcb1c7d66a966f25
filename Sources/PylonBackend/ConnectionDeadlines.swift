/// The three timeouts of a connection, in milliseconds (`--idle-timeout-ms`,
/// `--header-timeout-ms`, `--body-timeout-ms`).
package struct Timeouts: Equatable {
    /// Between requests: from the connection's start, the last complete request or the last
    /// completed write, with no byte of a new request. Expired: closed without a response.
    package var idleMs = Limits.defaultIdleTimeoutMs
    /// From the first byte of a request to the end of its head. Expired: 408, then close.
    package var headerMs = Limits.defaultHeaderTimeoutMs
    /// From the end of a request's head to the end of its body. Expired: 408, then close.
    package var bodyMs = Limits.defaultBodyTimeoutMs
}

/// Which deadline a connection is under and when it expires: a value type fed with events and
/// the loop's time (`uv_now`, ms), so `HTTPConnection` arms one timer for `next` and nothing
/// polls. Partial bytes never move a deadline: only a request's first byte (which starts the
/// header deadline), the end of its head, its completion, and a completed write do.
///
/// The header and body deadlines run only while the connection reads: when it stops for
/// backpressure (its own output is not drained) the client cannot make progress, so the idle
/// deadline, measured from the last completed write, applies instead, and the phase's clock
/// restarts when reading resumes.
struct ConnectionDeadlines: Equatable {
    enum Phase: Equatable {
        /// No byte of the next request has been parsed.
        case betweenRequests
        /// Inside a request head whose first byte was parsed at `since`.
        case head(since: UInt64)
        /// Inside a request body whose head ended at `since`.
        case body(since: UInt64)
    }

    /// What an expired deadline means.
    enum Expiry: Equatable {
        /// Nothing happened for `idleMs`: close without a response.
        case idle
        /// The request head or body is late: answer 408, then close.
        case header, body
    }

    let timeouts: Timeouts
    private(set) var phase = Phase.betweenRequests
    /// Start of the current idle period: the connection's start, the last complete request or
    /// the last completed write.
    private(set) var idleSince: UInt64

    init(timeouts: Timeouts, now: UInt64) {
        self.timeouts = timeouts
        idleSince = now
    }

    mutating func messageBegan(at now: UInt64) { phase = .head(since: now) }
    mutating func headersCompleted(at now: UInt64) { phase = .body(since: now) }
    mutating func messageCompleted(at now: UInt64) {
        phase = .betweenRequests
        idleSince = now
    }
    /// A write completed: the client is reading, so the connection is not idle.
    mutating func wrote(at now: UInt64) { idleSince = now }

    /// Reading resumed after backpressure: the request in progress gets a fresh deadline.
    mutating func readingResumed(at now: UInt64) {
        switch phase {
        case .betweenRequests: idleSince = now
        case .head: phase = .head(since: now)
        case .body: phase = .body(since: now)
        }
    }

    /// The deadline in force, or nil when none is. `reading`: the connection is parsing what
    /// arrives (false while stopped for backpressure). `held`: a response waits on injected
    /// latency, whose own timer moves the connection on.
    func next(reading: Bool, held: Bool) -> (at: UInt64, expiry: Expiry)? {
        switch phase {
        case .head(let since) where reading: return (since + timeouts.headerMs, .header)
        case .body(let since) where reading: return (since + timeouts.bodyMs, .body)
        default: return held ? nil : (idleSince + timeouts.idleMs, .idle)
        }
    }
}
