import PylonCore

/// Device registration as a value type: deferral, retries with backoff, the callers waiting
/// for a token (bind, unbind, Live Activity binds, `push.register`) with their deadlines, and
/// recovery from a backend that lost this device (docs/PUSH.md, "A backend that forgot the
/// device"): a periodic check, re-registration after a refused credential or an unknown token
/// (one attempt at a time, at most one per `minReregisterIntervalMs`), and rebinding after it.
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
        /// The backend's bindings of this device are gone (a new token, or a re-registration
        /// after it lost the device): bind the bound user and the Live Activities again, first.
        case rebind
    }
    /// Why the device registered again (`push.status` `reregistration.reason`).
    enum Reason: String, Equatable {
        /// A device endpoint answered 401: the backend no longer knows the device token.
        case credentialRejected = "credential_rejected"
        /// A push call answered 3001: the backend no longer knows the push token.
        case tokenUnknown = "token_unknown"
        /// A registration (the periodic check) answered another push token than ours.
        case tokenReplaced = "token_replaced"
    }

    private(set) var phase: Phase
    private(set) var token: String?
    private(set) var attempts = 0
    /// When the next registration attempt is due (after a failure).
    private(set) var retryAt: Int64?
    private(set) var waiters: [(id: Int, deadline: Int64)] = []
    let retryInitialMs: Int64
    let retryMaxMs: Int64
    /// Registrations again (lost credential or token) since the start, the last one's time and why.
    private(set) var reregistrations = 0
    private(set) var lastReregisterMs: Int64?
    private(set) var reason: Reason?
    /// When the next periodic check of the registration is due (nil: none planned).
    private(set) var checkAt: Int64?
    private(set) var lastCheckMs: Int64?
    /// A re-registration after a loss is owed a rebinding once it succeeds.
    private(set) var rebindOwed = false
    /// How often a registered device asks the backend whether it still knows it (0: never).
    let checkIntervalMs: Int64
    /// Least time between two re-registrations after a loss (a backend refusing every
    /// credential gets one attempt per interval from this device, not a storm).
    let minReregisterIntervalMs: Int64

    init(
        token: String?, deferred: Bool, retryInitialMs: Int64 = 1000, retryMaxMs: Int64 = 60_000, checkIntervalMs: Int64 = 0,
        minReregisterIntervalMs: Int64 = 0, rebindOwed: Bool = false
    ) {
        self.token = token
        self.rebindOwed = rebindOwed
        phase = token != nil ? .registered : (deferred ? .deferred : .idle)
        self.retryInitialMs = retryInitialMs
        self.retryMaxMs = retryMaxMs
        self.checkIntervalMs = checkIntervalMs
        self.minReregisterIntervalMs = minReregisterIntervalMs
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

    /// The backend answered token `t`. A token other than the one held (the backend lost ours)
    /// or a registration owed after a loss asks for `.rebind`, ahead of the waiters.
    mutating func succeeded(token t: String, now: Int64) -> [Action] {
        let replaced = token != nil && token != t
        if replaced, !rebindOwed {
            reason = .tokenReplaced
            reregistrations += 1
            lastReregisterMs = now
        }
        let rebind = replaced || rebindOwed
        rebindOwed = false
        token = t
        phase = .registered
        attempts = 0
        retryAt = nil
        checkAt = checkIntervalMs > 0 ? now + checkIntervalMs : nil
        let ids = waiters.map(\.id)
        waiters = []
        return (rebind ? [.rebind] : []) + (ids.isEmpty ? [] : [.ready(ids)])
    }

    mutating func failed(now: Int64) {
        attempts += 1
        phase = token != nil ? .registered : .idle
        retryAt =
            now
            + Int64(
                BackoffPolicy(initialMs: UInt64(max(0, retryInitialMs)), maxMs: UInt64(max(0, retryMaxMs)))
                    .delay(attempt: attempts))
        if let c = retryAt, minReregisterIntervalMs > 0, rebindOwed, let last = lastReregisterMs {
            retryAt = max(c, last + minReregisterIntervalMs)
        }
    }

    /// The backend no longer knows this device's credential or push token (`why`): the token
    /// held is dropped and the device registers again — at once, unless an attempt is running
    /// (it is the one in flight) or the last re-registration is younger than
    /// `minReregisterIntervalMs` (then when it is that old). Bindings are owed on success.
    mutating func lost(_ why: Reason, now: Int64) -> [Action] {
        token = nil
        rebindOwed = true
        reason = why
        checkAt = nil
        guard phase != .registering, phase != .deferred else { return [] }
        if let last = lastReregisterMs, minReregisterIntervalMs > 0, now - last < minReregisterIntervalMs {
            phase = .idle
            retryAt = last + minReregisterIntervalMs
            return []
        }
        reregistrations += 1
        lastReregisterMs = now
        phase = .registering
        retryAt = nil
        return [.register]
    }

    /// A token supplied by the app (`push.setDeviceToken`).
    mutating func setToken(_ t: String, now: Int64) -> [Action] { succeeded(token: t, now: now) }

    mutating func tick(now: Int64) -> [Action] {
        var out: [Action] = []
        let late = waiters.filter { $0.deadline <= now }.map(\.id)
        if !late.isEmpty {
            waiters.removeAll { $0.deadline <= now }
            out.append(.timedOut(late))
        }
        if let r = retryAt, r <= now, phase != .registering, phase != .deferred {
            retryAt = nil
            if rebindOwed {
                reregistrations += 1
                lastReregisterMs = now
            }
            phase = .registering
            out.append(.register)
        } else if let c = checkAt, c <= now, phase == .registered {
            // The periodic check: the same registration, which answers our token while the
            // backend knows the device (401 or another token when it does not).
            checkAt = nil
            lastCheckMs = now
            phase = .registering
            out.append(.register)
        }
        return out
    }

    func nextDeadline() -> Int64? {
        [waiters.map(\.deadline).min(), retryAt, phase == .registered ? checkAt : nil].compactMap { $0 }.min()
    }
}
