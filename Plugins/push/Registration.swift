import PylonCore

/// Device registration as a value type: deferral, retries with backoff, and the callers waiting
/// for a token (bind, unbind, Live Activity binds, `push.register`) with their deadlines.
///
/// Events return `Action`s; time comes only from arguments.
struct Registration {
    enum Phase: String, Equatable { case deferred, idle, registering, registered }
    enum Action: Equatable {
        /// POST the registration now.
        case register
        /// Waiters that can proceed (a token exists).
        case ready([Int])
        /// Waiters whose deadline passed without a token (3001).
        case timedOut([Int])
    }

    private(set) var phase: Phase
    private(set) var token: String?
    private(set) var attempts = 0
    /// When the next registration attempt is due (after a failure).
    private(set) var retryAt: Int64?
    private(set) var waiters: [(id: Int, deadline: Int64)] = []
    let retryInitialMs: Int64
    let retryMaxMs: Int64

    init(token: String?, deferred: Bool, retryInitialMs: Int64 = 1000, retryMaxMs: Int64 = 60_000) {
        self.token = token
        phase = token != nil ? .registered : (deferred ? .deferred : .idle)
        self.retryInitialMs = retryInitialMs
        self.retryMaxMs = retryMaxMs
    }

    /// At start: register unless deferred. A device with a stored token re-registers too (the
    /// backend answers the same token, or a new one that triggers rebinding).
    mutating func start() -> [Action] {
        guard phase != .deferred else { return [] }
        phase = .registering
        return [.register]
    }

    /// `push.register`: lifts the deferral and registers (again) unless an attempt is running.
    mutating func requestRegistration() -> [Action] {
        guard phase != .registering else { return [] }
        phase = .registering
        retryAt = nil
        return [.register]
    }

    /// A caller that needs a token; answered at once when there is one.
    mutating func wait(id: Int, now: Int64, timeoutMs: Int64) -> [Action] {
        if token != nil { return [.ready([id])] }
        waiters.append((id, now + timeoutMs))
        return []
    }

    mutating func succeeded(token t: String) -> [Action] {
        token = t
        phase = .registered
        attempts = 0
        retryAt = nil
        let ids = waiters.map(\.id)
        waiters = []
        return ids.isEmpty ? [] : [.ready(ids)]
    }

    mutating func failed(now: Int64) {
        attempts += 1
        phase = token != nil ? .registered : .idle
        retryAt =
            now
            + Int64(
                BackoffPolicy(initialMs: UInt64(max(0, retryInitialMs)), maxMs: UInt64(max(0, retryMaxMs)))
                    .delay(attempt: attempts))
    }

    /// A token supplied by the app (`push.setDeviceToken`).
    mutating func setToken(_ t: String) -> [Action] { succeeded(token: t) }

    mutating func tick(now: Int64) -> [Action] {
        var out: [Action] = []
        let late = waiters.filter { $0.deadline <= now }.map(\.id)
        if !late.isEmpty {
            waiters.removeAll { $0.deadline <= now }
            out.append(.timedOut(late))
        }
        if let r = retryAt, r <= now, phase != .registering, phase != .deferred {
            retryAt = nil
            phase = .registering
            out.append(.register)
        }
        return out
    }

    func nextDeadline() -> Int64? {
        let w = waiters.map(\.deadline).min()
        switch (w, retryAt) {
        case let (a?, b?): return min(a, b)
        case let (a?, nil): return a
        case let (nil, b?): return b
        default: return nil
        }
    }
}
