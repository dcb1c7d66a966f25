import PylonCore

/// An operator's role: `viewer` reads (every GET), `admin` also changes.
enum Role: String, Equatable, Sendable {
    case viewer, admin
}

/// Limits of operator sessions and logins (docs/SECURITY.md, "Operators and sessions").
enum SessionLimits {
    /// Default `--session-idle-ms`: a session unused this long is over (30 min).
    static let defaultIdleMs: Int64 = 30 * 60_000
    /// Default `--session-max-ms`: a session is over this long after login, used or not (12 h).
    static let defaultAbsoluteMs: Int64 = 12 * 3_600_000
    /// A session's last use is written back at most this often (and at least 4 times per
    /// idle period), so a busy console costs no write per request.
    static let touchIntervalMs: Int64 = 60_000
    /// Failed logins for one name, or from one client address, within `failureWindowMs`
    /// before further attempts are answered 429 until the oldest leaves the window. An address
    /// is allowed more (several operators may share one, behind a proxy or NAT).
    static let maxFailures = 5
    static let maxAddressFailures = 20
    static let failureWindowMs: Int64 = 60_000
    /// Addresses and names the login limiter remembers; beyond, the least recently failed
    /// entries are forgotten (the table is bounded whatever an attacker sends).
    static let maxTrackedKeys = 10_000
    /// Password hashes computed at once on the thread pool (each takes 32 MiB); beyond: 503
    /// `server_busy`, Retry-After: 1.
    static let maxPasswordJobs = 2
    /// Operator names: 1 to 64 of `[A-Za-z0-9._@-]`.
    static let maxNameBytes = 64
    /// Passwords set through the API, in bytes (the CLI reads a secret file: 16 to 4096).
    static let minPasswordBytes = 12
    static let maxPasswordBytes = 1024
    /// The name the operator token acts as (reserved: no account may take it).
    static let tokenName = "operator"
    static let cookieName = "pylon_session"

    static func validName(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= maxNameBytes
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x2E || c == 0x5F
                    || c == 0x40 || c == 0x2D
            }
    }
}

/// The session settings a backend runs with (`--session-idle-ms`, `--session-max-ms`,
/// `--cookie-secure`).
package struct SessionSettings: Sendable {
    package var idleMs = SessionLimits.defaultIdleMs
    package var absoluteMs = SessionLimits.defaultAbsoluteMs
    package var cookieSecure = false
    package init() {}

    /// How often a session's last use is written back.
    var touchMs: Int64 { min(SessionLimits.touchIntervalMs, max(1, idleMs / 4)) }

    func setCookie(_ id: String) -> String {
        "\(SessionLimits.cookieName)=\(id); Path=/; HttpOnly; SameSite=Strict; Max-Age=\(absoluteMs / 1000)"
            + (cookieSecure ? "; Secure" : "")
    }
    var clearCookie: String {
        "\(SessionLimits.cookieName)=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0" + (cookieSecure ? "; Secure" : "")
    }
}

/// Counts failed logins per client address and per name over a sliding window; a value type
/// the backend keeps on the loop (per instance).
struct LoginLimiter {
    var maxFailures = SessionLimits.maxFailures
    var maxAddressFailures = SessionLimits.maxAddressFailures
    var windowMs = SessionLimits.failureWindowMs
    var maxKeys = SessionLimits.maxTrackedKeys
    /// Failure times per key (`a:<address>` or `n:<name>`), oldest first, at most its limit.
    private(set) var failures: [String: [Int64]] = [:]

    /// Milliseconds until another attempt is allowed for these keys, or nil if allowed now.
    mutating func retryAfter(_ keys: [String], now: Int64) -> Int64? {
        var wait: Int64 = 0
        for k in keys {
            guard var f = failures[k] else { continue }
            f.removeAll { $0 <= now - windowMs }
            failures[k] = f.isEmpty ? nil : f
            let limit = limit(k)
            if f.count >= limit, let oldest = f.suffix(limit).first { wait = max(wait, oldest + windowMs - now) }
        }
        return wait > 0 ? wait : nil
    }

    mutating func fail(_ keys: [String], now: Int64) {
        if failures.count + keys.count > maxKeys { prune(now: now) }
        for k in keys {
            var f = failures[k] ?? []
            f.removeAll { $0 <= now - windowMs }
            f.append(now)
            if f.count > limit(k) { f.removeFirst(f.count - limit(k)) }
            failures[k] = f
        }
    }

    private func limit(_ key: String) -> Int { key.hasPrefix("a:") ? maxAddressFailures : maxFailures }

    /// A successful login clears its name's failures (not its address's).
    mutating func succeed(name: String) { failures[LoginLimiter.keys(address: "", name: name)[1]] = nil }

    /// Forgets expired entries, then the least recently failed ones down to half the bound.
    private mutating func prune(now: Int64) {
        failures = failures.filter { $0.value.last.map { $0 > now - windowMs } ?? false }
        guard failures.count > maxKeys / 2 else { return }
        let keep = failures.sorted { ($0.value.last ?? 0) > ($1.value.last ?? 0) }.prefix(maxKeys / 2)
        failures = Dictionary(uniqueKeysWithValues: keep.map { ($0.key, $0.value) })
    }

    /// The keys of an attempt: its address, and its name (cut to `SessionLimits.maxNameBytes`
    /// bytes, so a hostile name costs the table no more than a valid one).
    static func keys(address: String, name: String) -> [String] {
        ["a:" + address, "n:" + String(decoding: name.utf8.prefix(SessionLimits.maxNameBytes), as: UTF8.self)]
    }
}

enum SessionCookie {
    /// The value of cookie `pylon_session` in a `Cookie` header, if well-formed (64 hex digits).
    static func value(_ header: String?) -> String? {
        guard let header else { return nil }
        for part in header.split(separator: ";") {
            let kv = part.split(separator: "=", maxSplits: 1)
            guard kv.count == 2, kv[0].trimmingSpaces == SessionLimits.cookieName else { continue }
            let v = kv[1].trimmingSpaces
            return v.utf8.count == 64 && DeviceToken.isHex(v[...]) ? v : nil
        }
        return nil
    }
}
