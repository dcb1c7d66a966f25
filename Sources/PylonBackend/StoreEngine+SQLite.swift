import PylonStore

/// The embedded engine: one SQLite connection (`Database`). A transaction is `BEGIN IMMEDIATE`
/// (SQLite has one writer, so transactions are serial and never conflict); advisory locks are
/// not needed.
final class SQLiteEngine: SQLEngine {
    let database: Database
    var dialect: SQLDialect { .sqlite }

    init(_ database: Database) { self.database = database }

    func exec(_ sql: String) throws(StoreError) {
        do throws(SQLiteError) { try database.exec(sql) } catch { throw .sqlite(error) }
    }

    func query(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> [[SQLValue]] {
        do throws(SQLiteError) {
            let s = try prepared(sql, binds)
            var rows: [[SQLValue]] = []
            while try s.step() { rows.append((0..<s.columnCount).map { s.value($0) }) }
            return rows
        } catch {
            throw .sqlite(error)
        }
    }

    @discardableResult
    func run(_ sql: String, _ binds: [SQLBind]) throws(StoreError) -> Int {
        do throws(SQLiteError) {
            let s = try prepared(sql, binds)
            while try s.step() {}
            return database.changes
        } catch {
            throw .sqlite(error)
        }
    }

    private func prepared(_ sql: String, _ binds: [SQLBind]) throws(SQLiteError) -> Statement {
        let s = try database.prepare(sql)
        for (i, b) in binds.enumerated() {
            let idx = Int32(i + 1)
            switch b {
            case .null: try s.bind(at: idx, [.null])
            case .int(let v): try s.bindInt(idx, v)
            case .text(let t): try s.bindText(idx, string: t)
            case .bytes(let r):
                if let p = r.baseAddress {
                    try s.bindText(idx, p.assumingMemoryBound(to: CChar.self), Int32(r.count))
                } else {
                    try s.bindText(idx, string: "")
                }
            }
        }
        return s
    }

    func begin(_ isolation: Isolation) throws(StoreError) { try exec("BEGIN IMMEDIATE") }
    func commit() throws(StoreError) { try exec("COMMIT") }
    func rollback() { try? exec("ROLLBACK") }
    func lock(_ keys: [Int64]) throws(StoreError) {}
    func unlock(_ keys: [Int64]) {}
    func close() { database.close() }
}
