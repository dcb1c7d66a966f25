import CSQLite
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// A SQLite error: result code and message.
public struct SQLiteError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let message: String
    public var description: String { "sqlite \(code): \(message)" }
    public init(code: Int32, message: String) {
        self.code = code
        self.message = message
    }
}

/// One SQLite connection (`sqlite3_open_v2`), used from the loop thread only.
public final class Database {
    let db: OpaquePointer
    private var cache: [String: Statement] = [:]

    /// The files of database `path` this opener tightened to `StateFile.mode` (logged too).
    public private(set) var tightened: [StateFile.Tightened] = []

    /// Opens (creating if needed) the database at `path`, a state file (docs/SECURITY.md "File
    /// modes"): the file is created 0600 before SQLite opens it, never through a symlink (a link
    /// at `path` is refused: `SQLITE_OPEN_NOFOLLOW`), and an existing one, its `-wal`, `-shm` and
    /// `-journal` left by an earlier run are tightened to 0600 (each logged on `log`). SQLite
    /// creates the `-wal`, `-shm` and `-journal` files it makes later with the database file's
    /// mode, so they are 0600 too. `:memory:`, `""` and `file:` URIs are opened as they are; an
    /// existing file this user may not write is left to SQLite (read-only, or its error).
    public init(path: String, log: Log = Log("store")) throws(SQLiteError) {
        var fixed: [StateFile.Tightened] = []
        if !(path.isEmpty || path == ":memory:" || path.hasPrefix("file:")) {
            do throws(IOError) {
                if let t = try StateFile.create(path) { fixed.append(t) }
            } catch {
                // A file this user may read but not write: SQLite opens it read-only, as before.
                if error.errnoCode != EACCES && error.errnoCode != EROFS {
                    throw SQLiteError(code: SQLITE_CANTOPEN, message: error.description)
                }
            }
            for suffix in ["-wal", "-shm", "-journal"] { if let t = StateFile.tighten(path + suffix) { fixed.append(t) } }
            for t in fixed { t.report(to: log) }
        }
        var h: OpaquePointer?
        let rc = sqlite3_open_v2(
            path, &h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW, nil)
        guard rc == SQLITE_OK, let h else {
            let msg = h.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close(h)  // required even after a failed open
            throw SQLiteError(code: rc, message: "\(path): \(msg)")
        }
        db = h
        tightened = fixed
        sqlite3_busy_timeout(db, 5000)
    }

    /// Finalizes cached statements and closes. Call explicitly (not from deinit of an owner that
    /// may be mid-callback).
    public func close() {
        for s in cache.values { s.finalize() }
        cache.removeAll()
        sqlite3_close(db)
    }

    /// Runs one or more statements without results (`sqlite3_exec`).
    public func exec(_ sql: String) throws(SQLiteError) {
        var err: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(db, sql, nil, nil, &err)
        if rc != SQLITE_OK {
            let msg = err.map { String(cString: $0) } ?? "error"
            sqlite3_free(err)
            throw SQLiteError(code: rc, message: msg)
        }
    }

    /// A prepared statement, cached by its SQL text.
    public func prepare(_ sql: String) throws(SQLiteError) -> Statement {
        if let s = cache[sql] {
            s.reset()
            return s
        }
        var st: OpaquePointer?
        let rc = sqlite3_prepare_v2(db, sql, -1, &st, nil)
        guard rc == SQLITE_OK, let st else { throw error(rc) }
        let s = Statement(st, db: self)
        cache[sql] = s
        return s
    }

    /// Runs `body` in a transaction (BEGIN IMMEDIATE … COMMIT), rolling back if it throws.
    public func transaction<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        try exec("BEGIN IMMEDIATE")
        do {
            let r = try body()
            try exec("COMMIT")
            return r
        } catch {
            try? exec("ROLLBACK")
            throw error
        }
    }

    public var changes: Int { Int(sqlite3_changes(db)) }

    /// The rowid of the last successful INSERT (`sqlite3_last_insert_rowid`).
    public var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(db) }

    func error(_ rc: Int32) -> SQLiteError {
        SQLiteError(code: rc, message: String(cString: sqlite3_errmsg(db)))
    }

    /// Convenience: runs a statement with bindings to completion.
    public func run(_ sql: String, _ args: [SQLValue] = []) throws(SQLiteError) {
        let s = try prepare(sql)
        try s.bind(args)
        while try s.step() {}
    }

    /// Convenience: all rows of a query, each as an array of values.
    public func query(_ sql: String, _ args: [SQLValue] = []) throws(SQLiteError) -> [[SQLValue]] {
        let s = try prepare(sql)
        try s.bind(args)
        var rows: [[SQLValue]] = []
        while try s.step() { rows.append((0..<s.columnCount).map { s.value($0) }) }
        return rows
    }
}

public enum SQLValue: Equatable, Sendable {
    case null
    case int(Int64)
    case double(Double)
    case text(String)
    case blob([UInt8])

    public var int: Int64? { if case .int(let i) = self { return i }; return nil }
    public var text: String? {
        switch self {
        case .text(let t): return t
        case .blob(let b): return String(decoding: b, as: UTF8.self)
        default: return nil
        }
    }
}

public final class Statement {
    let st: OpaquePointer
    unowned let owner: Database
    init(_ st: OpaquePointer, db: Database) { self.st = st; owner = db }

    func finalize() { sqlite3_finalize(st) }
    public func reset() { sqlite3_reset(st); sqlite3_clear_bindings(st) }

    /// Binds a Swift string as text at 1-based `index` (an empty string stays text, not NULL).
    public func bindText(_ index: Int32, string: String) throws(SQLiteError) {
        var s = string
        let rc: Int32 =
            s.isEmpty
            ? pylon_sqlite_bind_text(st, index, "", 0)
            : s.withUTF8 { b in
                b.withMemoryRebound(to: CChar.self) { pylon_sqlite_bind_text(st, index, $0.baseAddress, Int32($0.count)) }
            }
        if rc != SQLITE_OK { throw owner.error(rc) }
    }

    /// Binds an integer at 1-based `index`.
    public func bindInt(_ index: Int32, _ v: Int64) throws(SQLiteError) {
        let rc = sqlite3_bind_int64(st, index, v)
        if rc != SQLITE_OK { throw owner.error(rc) }
    }

    /// Calls `body` with column `i`'s text bytes (valid only inside; empty for NULL).
    public func withText<R>(_ i: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        let n = Int(sqlite3_column_bytes(st, Int32(i)))
        return body(UnsafeRawBufferPointer(start: sqlite3_column_text(st, Int32(i)), count: n))
    }

    /// Binds text straight from C memory (copied by SQLite) at 1-based `index`.
    public func bindText(_ index: Int32, _ p: UnsafePointer<CChar>, _ n: Int32) throws(SQLiteError) {
        let rc = pylon_sqlite_bind_text(st, index, p, n)
        if rc != SQLITE_OK { throw owner.error(rc) }
    }

    /// Binds a byte array as a blob (`sqlite3_bind_blob`, copied by SQLite) at 1-based `index`
    /// (an empty array stays a zero-length blob, not NULL).
    public func bindBlob(_ index: Int32, bytes: [UInt8]) throws(SQLiteError) {
        let rc = bytes.withUnsafeBytes { b in
            pylon_sqlite_bind_blob(st, index, b.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(b.count))
        }
        if rc != SQLITE_OK { throw owner.error(rc) }
    }

    /// Calls `body` with column `i`'s blob bytes (`sqlite3_column_blob`; valid only inside; empty
    /// for NULL).
    public func withBlob<R>(_ i: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        let p = sqlite3_column_blob(st, Int32(i))
        let n = Int(sqlite3_column_bytes(st, Int32(i)))
        return body(UnsafeRawBufferPointer(start: n > 0 ? p : nil, count: n))
    }

    /// Column `i` as text (`sqlite3_column_text`; "" for NULL).
    public func text(_ i: Int) -> String {
        withText(i) { String(decoding: $0, as: UTF8.self) }
    }

    public func bind(_ args: [SQLValue]) throws(SQLiteError) { try bind(at: 1, args) }

    /// Binds `args` to consecutive parameters starting at 1-based `start`.
    public func bind(at start: Int32, _ args: [SQLValue]) throws(SQLiteError) {
        for (i, a) in args.enumerated() {
            let idx = start + Int32(i)
            let rc: Int32
            switch a {
            case .null: rc = sqlite3_bind_null(st, idx)
            case .int(let v): rc = sqlite3_bind_int64(st, idx, v)
            case .double(let v): rc = sqlite3_bind_double(st, idx, v)
            case .text(let v):
                try bindText(idx, string: v)  // one path for text (an empty string stays text)
                continue
            case .blob(let v): rc = v.withUnsafeBytes { pylon_sqlite_bind_blob(st, idx, $0.baseAddress, Int32($0.count)) }
            }
            if rc != SQLITE_OK { throw owner.error(rc) }
        }
    }

    /// Steps once: true when a row is available, false when done.
    public func step() throws(SQLiteError) -> Bool {
        let rc = sqlite3_step(st)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        throw owner.error(rc)
    }

    public var columnCount: Int { Int(sqlite3_column_count(st)) }

    public func value(_ i: Int) -> SQLValue {
        let c = Int32(i)
        switch sqlite3_column_type(st, c) {
        case SQLITE_INTEGER: return .int(sqlite3_column_int64(st, c))
        case SQLITE_FLOAT: return .double(sqlite3_column_double(st, c))
        case SQLITE_TEXT:
            let n = Int(sqlite3_column_bytes(st, c))
            guard let p = sqlite3_column_text(st, c) else { return .text("") }
            return .text(String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self))
        case SQLITE_BLOB:
            let n = Int(sqlite3_column_bytes(st, c))
            guard let p = sqlite3_column_blob(st, c) else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: p, count: n)))
        default: return .null
        }
    }
    public func int(_ i: Int) -> Int64 { sqlite3_column_int64(st, Int32(i)) }
}
