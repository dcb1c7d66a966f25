import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The console's per-instance state, on the loop thread (one stored property of `Backend`).
package struct ConsoleState {
    /// Runs password hashes off the loop (`runOnThreadPool`); nil computes them inline (tests
    /// of the value parts only).
    package var loop: Loop?
    package var sessions = SessionSettings()
    /// `--enable-reset`: `POST /v1/admin/reset` works; 404 `reset_disabled` otherwise.
    package var resetEnabled = false
    /// `--console-dir`, loaded at start (`StaticFiles`); nil: every console path is 404.
    package var files: StaticFiles?
    /// This instance's id in `backend_instances` (the dashboard's health table).
    package var instanceId = System.randomHex(6)
    package let startedMs = System.wallClockMs()
    var limiter = LoginLimiter()
    /// Password hashes running on the thread pool.
    var passwordJobs = 0
    var metrics = MetricsCounters()
    /// More metrics (`GET /metrics`): each appends its families to the text.
    package var metricSources: [(inout MetricsText) -> Void] = []
    /// The handler of the current request wrote its own audit entry (`Backend.audit`).
    var audited = false
    /// The current request's endpoint and caller, once admitted.
    var current: (Endpoint, Principal)?
    /// The upkeep timer (`Backend.startConsole`).
    var timer: Timer?
    /// Devices whose last use was written, and when (`ConsoleLimits.deviceSeenWriteMs`).
    var deviceSeenWritten: [String: Int64] = [:]

    package init() {}
}

extension APIError.Code {
    static let badCredentials = APIError.Code(rawValue: "bad_credentials")
    static let rateLimited = APIError.Code(rawValue: "rate_limited")
    static let noSession = APIError.Code(rawValue: "no_session")
    static let csrfRequired = APIError.Code(rawValue: "csrf_required")
    static let resetDisabled = APIError.Code(rawValue: "reset_disabled")
    static let conflict = APIError.Code(rawValue: "conflict")
}

extension APIError {
    static let badCredentials = APIError(status: 401, code: .badCredentials, message: "unknown name or wrong password or token")
    static func noSession(_ why: String) -> APIError { APIError(status: 401, code: .noSession, message: why) }
    static let csrfRequired = APIError(
        status: 403, code: .csrfRequired, message: "a change made with the session cookie needs its X-CSRF-Token header")
    static let adminOnly = APIError(
        status: 403, code: .forbidden, message: "this operator's role is viewer: changes need an admin", extra: ["reason": "admin_only"])
    static func rateLimited(_ waitMs: Int64) -> APIError {
        APIError(
            status: 429, code: .rateLimited, message: "too many failed logins: retry in \(waitMs) ms",
            retryAfter: Int((waitMs + 999) / 1000), extra: ["retryAfterMs": .int(waitMs)])
    }
    static let passwordBusy = APIError(
        status: 503, code: .serverBusy,
        message: "\(SessionLimits.maxPasswordJobs) password checks are running; retry", retryAfter: 1)
}

/// Logins, the session cookie and the checks every cookie request passes
/// (docs/SECURITY.md, "Operators and sessions").
extension Backend {
    static func isRead(_ method: String) -> Bool { method == "GET" || method == "HEAD" }

    /// The SHA-256 (hex) a session id is stored as.
    static func sessionHash(_ id: String) -> String {
        NKey.sha256(Array(id.utf8)).map { String($0, radix: 16).leftPad(2) }.joined()
    }

    /// The session of the request's cookie, unexpired (an expired one is deleted), or nil.
    func currentSession(_ request: HTTPRequest) throws(APIError) -> (idHash: String, row: Store.SessionRow)? {
        guard let id = SessionCookie.value(request.header("cookie")) else { return nil }
        return try currentSession(id: id)
    }

    private func currentSession(id: String) throws(APIError) -> (idHash: String, row: Store.SessionRow)? {
        let hash = Backend.sessionHash(id)
        guard let row = try storage({ () throws(StoreError) in try store.session(idHash: hash) }) else { return nil }
        let now = System.wallClockMs()
        let s = console.sessions
        if now - row.lastSeenMs > s.idleMs || now - row.createdMs > s.absoluteMs {
            try storage { () throws(StoreError) in try store.deleteSession(idHash: hash) }
            return nil
        }
        if now - row.lastSeenMs >= s.touchMs {
            try storage { () throws(StoreError) in try store.touchSession(idHash: hash, now: now) }
        }
        return (hash, row)
    }

    /// The principal of a cookie on an operator endpoint: 401 `no_session` when unknown or
    /// expired; for a change, 403 `csrf_required` without the session's `X-CSRF-Token`, then
    /// 403 `forbidden` (`reason: admin_only`) for a viewer.
    func sessionPrincipal(_ request: HTTPRequest, id: String) throws(APIError) -> Principal {
        guard let (_, s) = try currentSession(id: id) else { throw .noSession("no session, or it expired: log in again") }
        if !Backend.isRead(request.method) {
            guard let h = request.header("x-csrf-token"), Credentials.equal(h.utf8, Array(s.csrf.utf8)) else { throw .csrfRequired }
            guard s.role == .admin else { throw .adminOnly }
        }
        return .session(name: s.name, role: s.role)
    }

    private func sessionJSON(name: String, role: Role, csrf: String) -> JSON {
        [
            "name": .string(name), "role": .string(role.rawValue), "csrfToken": .string(csrf),
            "idleTimeoutMs": .int(console.sessions.idleMs),
        ]
    }

    /// Creates a session: its cookie and the answer of a login.
    private func startSession(name: String, role: Role) throws(APIError) -> HTTPResponse {
        let id = System.randomHex(32)
        let csrf = System.randomHex(16)
        let now = System.wallClockMs()
        try storage { () throws(StoreError) in
            try store.createSession(idHash: Backend.sessionHash(id), name: name, role: role, csrf: csrf, now: now)
        }
        log.info("operator logged in", ["name": name, "role": role.rawValue])
        return HTTPResponse(
            headers: [("Set-Cookie", console.sessions.setCookie(id)), ("Cache-Control", "no-store")],
            sessionJSON(name: name, role: role, csrf: csrf))
    }

    /// `POST /v1/session/login` `{"name","password"}` or `{"token"}`. Failures count per client
    /// address and per name (`LoginLimiter`); over the limit: 429 before any check. The
    /// password is checked on the thread pool, so the answer comes later.
    ///
    /// The body must be sent as `Content-Type: application/json`, which a cross-site HTML form
    /// cannot send: another site cannot log the browser into an account of its choosing.
    func login(_ request: HTTPRequest) throws(APIError) -> Disposition {
        guard request.header("content-type")?.lowercased().hasPrefix("application/json") == true else {
            throw .badRequest(.invalidRequest, "a login is sent as Content-Type: application/json")
        }
        let body = try jsonBody(request)
        let now = System.wallClockMs()
        if let token = body["token"]?.stringValue {
            let keys = LoginLimiter.keys(address: request.peer, name: SessionLimits.tokenName)
            if let wait = console.limiter.retryAfter(keys, now: now) { throw .rateLimited(wait) }
            guard let op = credentials.operatorToken, Credentials.equal(token.utf8, op) else {
                loginFailed(keys, name: SessionLimits.tokenName, request, now: now)
                throw .badCredentials
            }
            return .respond(try startSession(name: SessionLimits.tokenName, role: .admin), delayMs: 0)
        }
        guard let name = body["name"]?.stringValue, let password = body["password"]?.stringValue else {
            throw .badRequest(.invalidRequest, "name and password (or token) are required")
        }
        let keys = LoginLimiter.keys(address: request.peer, name: name)
        if let wait = console.limiter.retryAfter(keys, now: now) { throw .rateLimited(wait) }
        guard SessionLimits.validName(name), password.utf8.count <= SessionLimits.maxPasswordBytes else {
            loginFailed(keys, name: name, request, now: now)
            throw .badCredentials
        }
        let stored = try storage { () throws(StoreError) in try store.operatorCredential(name) }?.hash
        let answer = DeferredAnswer()
        let pw = Array(password.utf8)
        try hashOffLoop({ PasswordHash.verify(pw, stored ?? PasswordHash.decoy) && stored != nil }) { [unowned self] ok in
            let now = System.wallClockMs()
            do throws(APIError) {
                guard ok, let cred = try storage({ () throws(StoreError) in try store.operatorCredential(name) }) else {
                    loginFailed(keys, name: name, request, now: now)
                    throw .badCredentials
                }
                console.limiter.succeed(name: name)
                answer.answer(try startSession(name: name, role: cred.role))
            } catch {
                answer.answer(HTTPResponse(error))
            }
        }
        return .later(answer)
    }

    private func loginFailed(_ keys: [String], name: String, _ request: HTTPRequest, now: Int64) {
        console.limiter.fail(keys, now: now)
        console.metrics.loginFailures += 1
        log.info("login failed", ["name": name, "address": request.peer])
        audit(.anonymous, "session.login_failed", target: name, detail: ["address": .string(request.peer)])
    }

    /// Runs a password hash or check on the thread pool (at most `maxPasswordJobs` at once;
    /// beyond: 503), then `done` on the loop.
    func hashOffLoop<T: Sendable>(_ work: @escaping @Sendable () -> T, done: @escaping (T) -> Void) throws(APIError) {
        guard console.passwordJobs < SessionLimits.maxPasswordJobs else { throw .passwordBusy }
        guard let loop = console.loop else {
            done(work())
            return
        }
        console.passwordJobs += 1
        loop.runOnThreadPool(work) { [unowned self] r in
            console.passwordJobs -= 1
            done(r)
        }
    }

    /// `GET /v1/session`: the cookie's session, or 401 `no_session`.
    func sessionInfo(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        guard let (_, s) = try currentSession(request) else { throw .noSession("no session, or it expired: log in") }
        return HTTPResponse(headers: [("Cache-Control", "no-store")], sessionJSON(name: s.name, role: s.role, csrf: s.csrf))
    }

    /// `POST /v1/session/logout`: deletes the session (its CSRF token required) and clears the
    /// cookie; 204 also when there was no session.
    func logout(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        if let (hash, s) = try currentSession(request) {
            guard let h = request.header("x-csrf-token"), Credentials.equal(h.utf8, Array(s.csrf.utf8)) else { throw .csrfRequired }
            try storage { () throws(StoreError) in try store.deleteSession(idHash: hash) }
            log.info("operator logged out", ["name": s.name])
        }
        return HTTPResponse(
            status: 204, headers: [("Set-Cookie", console.sessions.clearCookie), ("Cache-Control", "no-store")],
            contentType: "application/json", bytes: [])
    }

    /// Deletes expired sessions and writes this instance's heartbeat (`main` runs it every
    /// `ConsoleLimits.heartbeatMs`).
    package func consoleTick() {
        let now = System.wallClockMs()
        do throws(StoreError) {
            try store.heartbeat(
                instance: console.instanceId, startedMs: console.startedMs, now: now, forgetBefore: now - ConsoleLimits.forgetInstanceMs)
            try store.purgeSessions(idleBefore: now - console.sessions.idleMs, createdBefore: now - console.sessions.absoluteMs)
        } catch {
            log.warn("console upkeep failed", ["error": error.description])
        }
        if console.deviceSeenWritten.count > ConsoleLimits.maxDeviceSeenEntries / 2 {
            console.deviceSeenWritten = console.deviceSeenWritten.filter { now - $0.value < ConsoleLimits.deviceSeenWriteMs }
        }
    }

    /// Records a device's use (at most once per `ConsoleLimits.deviceSeenWriteMs` per device
    /// and instance; the table of recent writes is bounded).
    func noteDeviceSeen(_ id: String) {
        let now = System.wallClockMs()
        if let t = console.deviceSeenWritten[id], now - t < ConsoleLimits.deviceSeenWriteMs { return }
        if console.deviceSeenWritten.count >= ConsoleLimits.maxDeviceSeenEntries { console.deviceSeenWritten = [:] }
        console.deviceSeenWritten[id] = now
        do throws(StoreError) { try store.deviceSeen(id, now: now) } catch {
            log.warn("cannot record a device's last use", ["error": error.description])
        }
    }
}

extension String {
    func leftPad(_ n: Int) -> String { count >= n ? self : String(repeating: "0", count: n - count) + self }
}

extension Backend {
    /// Applies the console's options: files, sessions, reset, the scrape token, the upkeep
    /// timer (heartbeat and expired sessions, every `ConsoleLimits.heartbeatMs`, not keeping
    /// the loop alive). The reason it cannot start, or nil.
    package func startConsole(_ o: ConsoleOptions, loop: Loop) -> String? {
        console.loop = loop
        console.sessions.idleMs = o.sessionIdleMs
        console.sessions.absoluteMs = o.sessionMaxMs
        console.sessions.cookieSecure = o.cookieSecure
        console.resetEnabled = o.enableReset
        if let dir = o.dir {
            switch StaticFiles.load(dir) {
            case .success(let f):
                console.files = f
                log.info("console files loaded", ["dir": dir, "files": f.count, "bytes": f.totalBytes])
            case .failure(let e): return "--console-dir: \(e.description)"
            }
        }
        if let path = o.metricsTokenFile {
            switch SecretFile.read(path) {
            case .success(let t): credentials.metricsToken = t
            case .failure(let e): return "--metrics-token-file: \(e.description)"
            }
        }
        consoleTick()
        let t = Timer(loop: loop, unref: true) { [unowned self] in consoleTick() }
        t.start(after: ConsoleLimits.heartbeatMs, repeat: ConsoleLimits.heartbeatMs)
        console.timer = t
        return nil
    }

    /// `--add-operator`: creates the account or sets its role and password (hashed here: no
    /// loop runs yet), audited as actor `cli`. The exit status.
    package static func addOperator(_ store: Store, _ o: ConsoleOptions, log: Log) -> Int32 {
        guard let name = o.addOperator, let path = o.passwordFile, let role = Role(rawValue: o.role) else { return 2 }
        let password: [UInt8]
        switch SecretFile.read(path) {
        case .success(let p): password = p
        case .failure(let e):
            log.error("cannot use the --password-file", ["error": e.description])
            return 1
        }
        guard let hash = PasswordHash.make(password) else {
            log.error("password hashing failed")
            return 1
        }
        do throws(StoreError) {
            let now = System.wallClockMs()
            let created = try store.createOperator(name, role: role, hash: hash, now: now)
            if !created { _ = try store.updateOperator(name, role: role, hash: hash) }
            try store.appendAudit(
                timeMs: now, actor: "cli", action: created ? "operator.create" : "operator.update", target: name,
                detail: JSON.object(["role": .string(role.rawValue), "passwordChanged": true]).serialized)
            log.info(created ? "operator created" : "operator updated", ["name": name, "role": role.rawValue])
            return 0
        } catch {
            log.error("cannot store the operator", ["error": error.description])
            return 1
        }
    }
}
