import PylonCore
import PylonStore

/// The SQL engine under `Store`: the embedded SQLite file (`SQLiteEngine`, the default) or a
/// shared PostgreSQL database (`PostgresEngine`, `--db postgresql://…`). The store writes its SQL
/// once, with `?` or `?N` parameters and the syntax both engines share (`INSERT … ON CONFLICT`,
/// `RETURNING`); what differs is named in `SQLDialect`.
///
/// An engine is used from the loop thread only, one statement at a time.
protocol SQLEngine: AnyObject {
    var dialect: SQLDialect { get }
    /// Runs one or more statements without parameters or results (schema, resets).
    func exec(_ sql: String) throws(StoreError)
    /// Every row of a prepared statement (cached by its text) run with `binds`.
    func query(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> [[SQLValue]]
    /// Runs a prepared statement with `binds`; answers the number of rows it changed.
    @discardableResult func run(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> Int
    /// Starts a transaction (`isolation` is PostgreSQL's; SQLite's writer lock is serial).
    func begin(_ isolation: Isolation) throws(StoreError)
    func commit() throws(StoreError)
    /// Rolls back (errors are ignored: a lost connection has rolled back already).
    func rollback()
    /// Takes the session-level advisory locks `keys` in the order given (PostgreSQL; a no-op on
    /// SQLite), and releases them.
    func lock(_ keys: [Int64]) throws(StoreError)
    func unlock(_ keys: [Int64])
    func close()
}

extension SQLEngine {
    func query(_ sql: String) throws(StoreError) -> [[SQLValue]] { try query(sql, []) }
}

/// A statement parameter.
enum SQLBind {
    case null
    case int(Int64)
    case text(String)
    /// Bytes bound as text, valid for the duration of the call (a batch's record ids and data).
    case bytes(UnsafeRawBufferPointer)

    init(_ v: SQLValue) {
        switch v {
        case .null: self = .null
        case .int(let i): self = .int(i)
        case .double(let d): self = .text(String(d))
        case .text(let t): self = .text(t)
        case .blob(let b): self = .text(String(decoding: b, as: UTF8.self))
        }
    }
}

/// The isolation of a request transaction on PostgreSQL (docs/FLEET.md, "State on PostgreSQL").
enum Isolation {
    /// Every request that reads before it writes: a concurrent change to what it read aborts it
    /// with 40001 and `Store.transaction` runs the whole request again.
    case serializable
    /// Ingest: idempotent by unique keys and `ON CONFLICT` alone.
    case readCommitted
}

/// The per-engine differences, kept small and named.
enum SQLDialect {
    case sqlite, postgres

    /// A schema written for SQLite, in this dialect. On PostgreSQL: integers are 64-bit,
    /// `INTEGER PRIMARY KEY [AUTOINCREMENT]` is a `BIGSERIAL` key, and text compares by bytes
    /// (`COLLATE "C"`, as SQLite does) whatever the database's locale.
    func schema(_ sqlite: String) -> String {
        guard self == .postgres else { return sqlite }
        return
            sqlite
            .replacingAll("INTEGER PRIMARY KEY AUTOINCREMENT", with: "BIGSERIAL PRIMARY KEY")
            .replacingAll("INTEGER PRIMARY KEY", with: "BIGSERIAL PRIMARY KEY")
            .replacingAll("INTEGER", with: "BIGINT")
            .replacingAll(" TEXT", with: " TEXT COLLATE \"C\"")
    }
}

/// Why a store operation failed. `status` is what the client is answered.
package enum StoreError: Error, CustomStringConvertible {
    case sqlite(SQLiteError)
    /// An error PostgreSQL reported, with its SQLSTATE.
    case postgres(sqlstate: String, message: String)
    /// The database cannot be reached (not connected, the connection was lost, or it is
    /// restarting): 503, and the next request reconnects.
    case unavailable(String)
    /// A transaction still conflicted after `StoreLimits.maxTransactionAttempts`: 503.
    case busy(String)
    /// Text PostgreSQL cannot store (a NUL character).
    case unstorableText

    package var description: String {
        switch self {
        case .sqlite(let e): return e.description
        case .postgres(let state, let message): return "postgresql \(state): \(message)"
        case .unavailable(let why): return "database unavailable: \(why)"
        case .busy(let why): return "database busy: \(why)"
        case .unstorableText: return "text with a NUL character cannot be stored"
        }
    }

    /// A conflict the whole transaction is run again for: serialization failure (40001),
    /// deadlock (40P01), or a unique violation inside a serializable transaction (23505, which
    /// PostgreSQL reports for a key a concurrent transaction inserted meanwhile).
    var isConflict: Bool {
        if case .postgres(let s, _) = self { return s == "40001" || s == "40P01" || s == "23505" }
        return false
    }

    /// The HTTP status: 503 (retry) when the database is unreachable, restarting, overloaded or
    /// the statement timed out; 400 for unstorable text; 500 otherwise.
    var status: Int {
        switch self {
        case .unavailable, .busy: return 503
        case .unstorableText: return 400
        case .postgres(let s, _):
            // 08: connection exception; 57P0x: shutdown/restart; 57014: statement_timeout;
            // 53: insufficient resources (too many connections, out of memory, disk full).
            if s.hasPrefix("08") || s.hasPrefix("57P") || s == "57014" || s.hasPrefix("53") { return 503 }
            return 500
        case .sqlite: return 500
        }
    }
}

/// Store limits (named; see docs/FLEET.md).
package enum StoreLimits {
    /// Runs of one request transaction that conflicted (40001/40P01/23505) before answering 503.
    static let maxTransactionAttempts = 10
    /// Default `statement_timeout` on PostgreSQL (`--db-timeout-ms`): a statement running longer
    /// is cancelled and the request answered 503, so a stuck database cannot hold the loop.
    package static let defaultStatementTimeoutMs = 5000
    /// Default `connect_timeout` (seconds) when the connection string names none.
    static let defaultConnectTimeoutSeconds = 5
    /// After a failed connection attempt, requests within this interval are answered 503 without
    /// trying again (a down database costs one connect per interval, not one per request).
    static let reconnectIntervalMs: UInt64 = 200
    /// TCP bounds on a connection whose packets are dropped (libpq's `tcp_user_timeout`,
    /// `keepalives_idle`, `keepalives_count` with a 1 s interval; a connection string may set
    /// its own): a statement waiting on such a connection fails within about 2 s, instead of
    /// TCP's minutes, and holds the loop no longer than that.
    static let tcpUserTimeoutMs = 2000
    static let keepaliveIdleSeconds = 1
    static let keepaliveCount = 2
}

extension String {
    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var out = ""
        var rest = self[...]
        while let r = rest.range(of: target[...]) {
            out += rest[..<r.lowerBound]
            out += replacement
            rest = rest[r.upperBound...]
        }
        out += rest
        return out
    }
}
