import CLibUV
import CPQ
import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The shared engine: one libpq connection to PostgreSQL (`--db postgresql://…`).
///
/// Statements are synchronous on the loop thread: a backend instance runs one statement at a
/// time and scales by instances (docs/FLEET.md). `statement_timeout` bounds each statement, and
/// TCP keepalives and `tcp_user_timeout` bound one whose packets are dropped; a lost connection
/// fails the statement with `StoreError.unavailable` (503). Once the loop runs
/// (`reconnect(on:)`), a new connection is made without holding the loop: `PQconnectStartParams`
/// and `PQconnectPoll` driven by a libuv poll on the connection's socket, bounded by
/// `connect_timeout`; requests meanwhile are answered 503 at once. Statements are prepared once
/// per connection (by their text) and run with text parameters; `?` and `?N` are rewritten to
/// `$n`.
final class PostgresEngine: SQLEngine {
    var dialect: SQLDialect { .postgres }
    private let url: String
    private let statementTimeoutMs: Int
    private var conn: OpaquePointer?
    /// SQL text → prepared statement name, for the current connection.
    private var statements: [String: String] = [:]
    private var inTransaction = false
    private var lastFailedConnectMs: UInt64 = 0
    private let log = Log("store")
    /// Connections made after the first (reconnects).
    private(set) var reconnects = 0
    /// Connection attempts made after the first (each reconnect tried, whether it worked).
    private(set) var reconnectAttempts = 0
    /// The loop reconnects run on, without blocking it; nil before it runs (start-up, tools):
    /// then a reconnect is synchronous.
    private var loop: Loop?
    /// The connection being made in the background, its socket's poll and its deadline.
    private var pending: (conn: OpaquePointer, poll: SocketPoll, deadline: Timer)?

    /// Connects (failing if the database cannot be reached now).
    init(url: String, statementTimeoutMs: Int) throws(StoreError) {
        self.url = url
        self.statementTimeoutMs = statementTimeoutMs
        try connect()
    }

    /// libpq's connection parameters: earlier entries are defaults the connection string
    /// (expanded from `dbname`) overrides.
    private func withParameters<T>(_ body: ([UnsafePointer<CChar>?], [UnsafePointer<CChar>?]) -> T) -> T {
        let params = [
            ("connect_timeout", String(StoreLimits.defaultConnectTimeoutSeconds)),
            ("application_name", "pylon-backend"),
            // A statement whose packets are dropped fails in seconds, not at TCP's minutes.
            ("keepalives", "1"), ("keepalives_idle", String(StoreLimits.keepaliveIdleSeconds)),
            ("keepalives_interval", "1"), ("keepalives_count", String(StoreLimits.keepaliveCount)),
            ("tcp_user_timeout", String(StoreLimits.tcpUserTimeoutMs)),
            ("dbname", url),
        ]
        let kp = params.map { strdup($0.0) }
        let vp = params.map { strdup($0.1) }
        defer {
            for p in kp + vp { free(p) }
        }
        return body(kp.map { UnsafePointer($0) } + [nil], vp.map { UnsafePointer($0) } + [nil])
    }

    /// The `connect_timeout` in force, in ms: the connection string's (libpq treats values below
    /// 2 s as 2 s), else the default.
    static func connectTimeoutMs(_ url: String) -> UInt64 {
        let fallback = UInt64(StoreLimits.defaultConnectTimeoutSeconds) * 1000
        var err: UnsafeMutablePointer<CChar>?
        guard let opts = PQconninfoParse(url, &err) else {
            PQfreemem(err)
            return fallback
        }
        defer { PQconninfoFree(opts) }
        var i = 0
        while let kw = opts[i].keyword {
            if String(cString: kw) == "connect_timeout", let val = opts[i].val, let n = UInt64(String(cString: val)), n > 0 {
                return max(2, n) * 1000
            }
            i += 1
        }
        return fallback
    }

    private func connect() throws(StoreError) {
        if let c = conn { PQfinish(c) }
        conn = nil
        statements = [:]
        let c = withParameters { k, v in PQconnectdbParams(k, v, 1) }
        guard let c, PQstatus(c) == CONNECTION_OK else {
            let why = c.map { String(cString: PQerrorMessage($0)) } ?? "out of memory"
            if let c { PQfinish(c) }
            lastFailedConnectMs = Self.monotonicMs()
            throw .unavailable(why.trimmingNewlines)
        }
        try adopt(c)
    }

    /// Makes `c`, just connected, the connection: quiet notices, the statement timeout.
    private func adopt(_ c: OpaquePointer) throws(StoreError) {
        conn = c
        // Server notices (a WARNING as the server shuts down) would go to stderr unformatted.
        PQsetNoticeProcessor(c, { _, _ in }, nil)
        do throws(StoreError) {
            // Notices (CREATE … IF NOT EXISTS "skipping") would go to stderr: keep warnings only.
            try simple("SET client_min_messages = warning; SET statement_timeout = \(statementTimeoutMs)")
        } catch {
            drop()
            lastFailedConnectMs = Self.monotonicMs()
            throw error
        }
    }

    /// The connection, reconnecting when it was lost (never inside a transaction: the statements
    /// after the loss would run outside it). On the loop, the reconnect is started in the
    /// background and this call answers `.unavailable` (503) at once.
    private func connection() throws(StoreError) -> OpaquePointer {
        if let c = conn, PQstatus(c) == CONNECTION_OK { return c }
        if inTransaction { throw .unavailable("the connection was lost during a transaction") }
        if pending != nil { throw .unavailable("reconnecting") }
        if Self.monotonicMs() &- lastFailedConnectMs < StoreLimits.reconnectIntervalMs, lastFailedConnectMs != 0 {
            throw .unavailable("reconnecting")
        }
        reconnectAttempts += 1
        if let loop {
            startConnect(loop)
            if let c = conn { return c }
            throw .unavailable("reconnecting")
        }
        try connect()
        reconnects += 1
        log.info("reconnected to PostgreSQL")
        return conn!
    }

    var isConnected: Bool { conn.map { PQstatus($0) == CONNECTION_OK } ?? false }

    /// From now on, reconnect without blocking `loop` (called once the loop is about to run).
    func reconnect(on loop: Loop) { self.loop = loop }

    /// Starts a non-blocking connection; `advance` drives it as its socket becomes ready.
    private func startConnect(_ loop: Loop) {
        drop()
        guard let c = withParameters({ k, v in PQconnectStartParams(k, v, 1) }), PQstatus(c) != CONNECTION_BAD else {
            connectFailed(nil, "cannot start a connection")
            return
        }
        let poll = SocketPoll(loop: loop, fd: PQsocket(c)) { [unowned self] _, _ in self.advance() }
        let timeoutMs = Self.connectTimeoutMs(url)
        let deadline = loop.after(ms: timeoutMs) { [unowned self] in
            guard let p = self.pending else { return }
            self.connectFailed(p.conn, "timed out after \(timeoutMs) ms")
        }
        pending = (c, poll, deadline)
        poll.watch(Int32(UV_WRITABLE.rawValue))
    }

    /// One step of `PQconnectPoll` (its socket is ready).
    private func advance() {
        guard let p = pending, let loop else { return }
        let state = PQconnectPoll(p.conn)
        switch state {
        case PGRES_POLLING_OK:
            p.poll.close()
            p.deadline.cancel()
            pending = nil
            do throws(StoreError) {
                try adopt(p.conn)
                reconnects += 1
                log.info("reconnected to PostgreSQL")
            } catch {
                log.warn("PostgreSQL reconnect failed", ["error": error.description])
            }
        case PGRES_POLLING_FAILED:
            connectFailed(p.conn, String(cString: PQerrorMessage(p.conn)).trimmingNewlines)
        default:
            // libpq may move to another socket (another host or address of the connection string).
            let fd = PQsocket(p.conn)
            let events = Int32(state == PGRES_POLLING_READING ? UV_READABLE.rawValue : UV_WRITABLE.rawValue)
            if fd != p.poll.fd {
                p.poll.close()
                let poll = SocketPoll(loop: loop, fd: fd) { [unowned self] _, _ in self.advance() }
                pending = (p.conn, poll, p.deadline)
                poll.watch(events)
            } else {
                p.poll.watch(events)
            }
        }
    }

    private func connectFailed(_ c: OpaquePointer?, _ why: String) {
        if let p = pending {
            p.poll.close()
            p.deadline.cancel()
        }
        pending = nil
        if let c { PQfinish(c) }
        lastFailedConnectMs = Self.monotonicMs()
        log.warn("PostgreSQL reconnect failed", ["error": why])
    }

    private static func monotonicMs() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1000 + UInt64(ts.tv_nsec) / 1_000_000
    }

    /// Checks a result; answers it when it succeeded (the caller clears it).
    private func check(_ res: OpaquePointer?, _ c: OpaquePointer) throws(StoreError) -> OpaquePointer {
        guard let res else {
            let why = String(cString: PQerrorMessage(c)).trimmingNewlines
            drop()
            throw .unavailable(why)
        }
        let st = PQresultStatus(res)
        if st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK { return res }
        let state = PQresultErrorField(res, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
        let message = String(cString: PQresultErrorMessage(res)).trimmingNewlines
        PQclear(res)
        // No SQLSTATE: libpq's own error (the server closed the connection, which PQstatus may
        // report only on the next call).
        if PQstatus(c) != CONNECTION_OK || state.isEmpty {
            drop()
            throw .unavailable(message)
        }
        throw .postgres(sqlstate: state, message: message)
    }

    /// Closes a connection that failed; the next call outside a transaction connects again.
    private func drop() {
        if let c = conn { PQfinish(c) }
        conn = nil
        statements = [:]
    }

    /// Runs `sql` with the simple protocol (several statements, no parameters).
    private func simple(_ sql: String) throws(StoreError) {
        guard let c = conn else { throw .unavailable("not connected") }
        PQclear(try check(PQexec(c, sql), c))
    }

    func exec(_ sql: String) throws(StoreError) {
        _ = try connection()
        try simple(sql)
    }

    private func prepare(_ sql: String, _ c: OpaquePointer) throws(StoreError) -> String {
        if let name = statements[sql] { return name }
        let name = "pylon\(statements.count)"
        PQclear(try check(PQprepare(c, name, PostgresEngine.numbered(sql), 0, nil), c))
        statements[sql] = name
        return name
    }

    /// Runs a prepared statement; the caller clears the result.
    private func execute(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> OpaquePointer {
        let c = try connection()
        let name = try prepare(sql, c)
        // Every value as NUL-terminated text in one buffer (text may not hold a NUL).
        var buf: [UInt8] = [0]
        var offsets: [Int] = []
        offsets.reserveCapacity(binds.count)
        for b in binds {
            switch b {
            case .null: offsets.append(-1)
            case .int(let v):
                offsets.append(buf.count)
                buf.append(contentsOf: String(v).utf8)
                buf.append(0)
            case .text(let s):
                if s.utf8.contains(0) { throw .unstorableText }
                offsets.append(buf.count)
                buf.append(contentsOf: s.utf8)
                buf.append(0)
            case .bytes(let r):
                if r.contains(0) { throw .unstorableText }
                offsets.append(buf.count)
                buf.append(contentsOf: r)
                buf.append(0)
            }
        }
        let res = buf.withUnsafeBufferPointer { bp -> OpaquePointer? in
            let base = UnsafeRawPointer(bp.baseAddress!).assumingMemoryBound(to: CChar.self)
            let values: [UnsafePointer<CChar>?] = offsets.map { $0 < 0 ? nil : base + $0 }
            return PQexecPrepared(c, name, Int32(values.count), values, nil, nil, 0)
        }
        return try check(res, c)
    }

    func query(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> [[SQLValue]] {
        let res = try execute(sql, binds)
        defer { PQclear(res) }
        let n = PQntuples(res)
        let m = PQnfields(res)
        let types = (0..<m).map { PQftype(res, $0) }
        var rows: [[SQLValue]] = []
        rows.reserveCapacity(Int(n))
        for r in 0..<n {
            var row: [SQLValue] = []
            row.reserveCapacity(Int(m))
            for f in 0..<m {
                if PQgetisnull(res, r, f) != 0 {
                    row.append(.null)
                    continue
                }
                let p = UnsafeRawPointer(PQgetvalue(res, r, f)!)
                let text = String(decoding: UnsafeRawBufferPointer(start: p, count: Int(PQgetlength(res, r, f))), as: UTF8.self)
                row.append(PostgresEngine.value(text, type: types[Int(f)]))
            }
            rows.append(row)
        }
        return rows
    }

    /// A text-format column value as the store reads it (integers as `.int`, as from SQLite).
    static func value(_ text: String, type: Oid) -> SQLValue {
        switch type {
        case 20, 21, 23, 26: return .int(Int64(text) ?? 0)  // int8, int2, int4, oid
        case 16: return .int(text == "t" ? 1 : 0)  // bool
        case 700, 701: return .double(Double(text) ?? 0)
        case 1700: return Int64(text).map { .int($0) } ?? .double(Double(text) ?? 0)  // numeric (sum)
        default: return .text(text)
        }
    }

    @discardableResult
    func run(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> Int {
        let res = try execute(sql, binds)
        defer { PQclear(res) }
        return Int(String(cString: PQcmdTuples(res))) ?? 0
    }

    func begin(_ isolation: Isolation) throws(StoreError) {
        let c = try connection()
        let level = isolation == .serializable ? "SERIALIZABLE" : "READ COMMITTED"
        PQclear(try check(PQexec(c, "BEGIN ISOLATION LEVEL " + level), c))
        inTransaction = true
    }

    func commit() throws(StoreError) {
        defer { inTransaction = false }
        guard let c = conn else { throw .unavailable("not connected") }
        let res = try check(PQexec(c, "COMMIT"), c)
        defer { PQclear(res) }
        // COMMIT of a transaction an error aborted answers ROLLBACK: nothing was stored.
        if String(cString: PQcmdStatus(res)) == "ROLLBACK" {
            throw .postgres(sqlstate: "25P02", message: "the transaction was aborted and rolled back")
        }
    }

    func rollback() {
        defer { inTransaction = false }
        guard let c = conn, PQstatus(c) == CONNECTION_OK else { return }
        PQclear(PQexec(c, "ROLLBACK"))
    }

    func lock(_ keys: [Int64]) throws(StoreError) {
        for k in keys { _ = try query("SELECT pg_advisory_lock(?)", [.int(k)]) }
    }

    func unlock(_ keys: [Int64]) {
        guard let c = conn, PQstatus(c) == CONNECTION_OK else { return }  // a lost session holds no locks
        for k in keys { _ = try? query("SELECT pg_advisory_unlock(?)", [.int(k)]) }
    }

    func close() {
        if let p = pending { connectFailed(p.conn, "closed") }
        if let c = conn { PQfinish(c) }
        conn = nil
    }

    /// `sql` with each `?` outside quotes as `$1`, `$2`, … and each `?N` as `$N`.
    static func numbered(_ sql: String) -> String {
        var out: [UInt8] = []
        var n = 0
        var quote: UInt8 = 0
        let u = Array(sql.utf8)
        var i = 0
        while i < u.count {
            let ch = u[i]
            if quote != 0 {
                if ch == quote { quote = 0 }
            } else if ch == UInt8(ascii: "'") || ch == UInt8(ascii: "\"") {
                quote = ch
            } else if ch == UInt8(ascii: "?") {
                var j = i + 1
                while j < u.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(u[j]) { j += 1 }
                out.append(UInt8(ascii: "$"))
                if j > i + 1 {
                    out.append(contentsOf: u[(i + 1)..<j])
                } else {
                    n += 1
                    out.append(contentsOf: String(n).utf8)
                }
                i = j
                continue
            }
            out.append(ch)
            i += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `url` without its password (for logs): `postgresql://user:***@host/db`, `password=***`.
    static func redacted(_ url: String) -> String {
        var s = url
        if let scheme = s.range(of: "://") {
            let rest = s[scheme.upperBound...]
            let authorityEnd = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
                s = String(s[..<s.index(after: colon)]) + "***" + String(s[at...])
            }
        }
        var parts = s.split(separator: "password=", omittingEmptySubsequences: false).map(String.init)
        for i in parts.indices.dropFirst() {
            let end = parts[i].firstIndex(where: { $0 == "&" || $0 == " " }) ?? parts[i].endIndex
            parts[i] = "***" + parts[i][end...]
        }
        return parts.joined(separator: "password=")
    }
}

extension String {
    var trimmingNewlines: String {
        var s = self[...]
        while let l = s.last, l == "\n" || l == "\r" || l == " " { s = s.dropLast() }
        return String(s)
    }
}
