import PylonCore
import PylonStore

/// The console's tables (docs/SECURITY.md, "Operators and sessions"; docs/CONSOLE.md).
///
/// - `operators`: operator accounts: name, role, scrypt hash (`PasswordHash`).
/// - `operator_sessions`: a login; keyed by the SHA-256 of the cookie's 256-bit id (the id
///   itself is never stored), with its CSRF token, creation and last use. Shared by every
///   instance using the database, so a load balancer may send a session anywhere.
/// - `audit_log`: every change an operator made (append-only; the API never deletes from it).
/// - `backend_instances`: each running backend's heartbeat (the dashboard's health table).
/// - `device_seen`: a device's last authenticated request (written at most once per
///   `ConsoleLimits.deviceSeenWriteMs`).
/// - `gtm_version_actors`: who published each container version.
///
/// And indexes on other parts' tables the console's pages read by: batches by time (events per
/// minute and day from `accepted`, which NATS mode keeps too), deliveries by each funnel time,
/// events by install (a device's page).
extension Store {
    static let consoleSchema = """
        CREATE TABLE IF NOT EXISTS operators (
            name TEXT PRIMARY KEY,
            role TEXT NOT NULL,
            password_hash TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_login_at INTEGER
        );
        CREATE TABLE IF NOT EXISTS operator_sessions (
            id_hash TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            role TEXT NOT NULL,
            csrf TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS operator_sessions_name ON operator_sessions(name);
        CREATE TABLE IF NOT EXISTS audit_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            time_ms INTEGER NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            detail TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS audit_log_actor ON audit_log(actor, id);
        CREATE INDEX IF NOT EXISTS audit_log_action ON audit_log(action, id);
        CREATE TABLE IF NOT EXISTS backend_instances (
            id TEXT PRIMARY KEY,
            started_at INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS device_seen (
            device_id TEXT PRIMARY KEY,
            last_seen_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS gtm_version_actors (
            container_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            actor TEXT NOT NULL,
            PRIMARY KEY (container_id, version)
        );
        CREATE INDEX IF NOT EXISTS batches_received ON batches(received_at);
        CREATE INDEX IF NOT EXISTS batches_stream_received ON batches(stream, received_at);
        CREATE INDEX IF NOT EXISTS push_deliveries_published ON push_deliveries(published_at);
        CREATE INDEX IF NOT EXISTS push_deliveries_puback ON push_deliveries(puback_at);
        CREATE INDEX IF NOT EXISTS push_deliveries_acked ON push_deliveries(acked_at);
        CREATE INDEX IF NOT EXISTS push_deliveries_token ON push_deliveries(token, published_at);
        CREATE INDEX IF NOT EXISTS events_install_app_time ON events(install_id, app_key, time_ms);
        """

    /// What `POST /v1/admin/reset` removes of these tables (accounts, sessions, the audit log
    /// and devices' last use stay).
    static let consoleReset = "DELETE FROM gtm_version_actors;"

    // MARK: Operators

    struct OperatorRow: Equatable {
        var name: String
        var role: Role
        var createdMs: Int64
        var lastLoginMs: Int64?
    }

    func operators(after: String, limit: Int) throws(StoreError) -> [OperatorRow] {
        try db.query(
            "SELECT name, role, created_at, last_login_at FROM operators WHERE name > ? ORDER BY name LIMIT ?",
            [.text(after), .int(Int64(limit))]
        ).map {
            OperatorRow(
                name: $0[0].text ?? "", role: Role(rawValue: $0[1].text ?? "") ?? .viewer, createdMs: $0[2].int ?? 0, lastLoginMs: $0[3].int
            )
        }
    }

    /// The account's role and password hash.
    func operatorCredential(_ name: String) throws(StoreError) -> (role: Role, hash: String)? {
        guard let r = try db.query("SELECT role, password_hash FROM operators WHERE name = ?", [.text(name)]).first,
            let role = Role(rawValue: r[0].text ?? ""), let h = r[1].text
        else { return nil }
        return (role, h)
    }

    func hasOperators() throws(StoreError) -> Bool { !(try db.query("SELECT 1 FROM operators LIMIT 1")).isEmpty }

    /// Creates an account; false if the name is taken.
    func createOperator(_ name: String, role: Role, hash: String, now: Int64) throws(StoreError) -> Bool {
        try db.run(
            "INSERT INTO operators (name, role, password_hash, created_at) VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
            [.text(name), .text(role.rawValue), .text(hash), .int(now)]) == 1
    }

    /// Changes an account's role and/or password; false if there is none. A new role applies
    /// to its open sessions at once; a new password ends them.
    func updateOperator(_ name: String, role: Role?, hash: String?) throws(StoreError) -> Bool {
        try transaction { () throws(StoreError) -> Bool in
            guard try operatorCredential(name) != nil else { return false }
            if let role {
                try db.run("UPDATE operators SET role = ? WHERE name = ?", [.text(role.rawValue), .text(name)])
                try db.run("UPDATE operator_sessions SET role = ? WHERE name = ?", [.text(role.rawValue), .text(name)])
            }
            if let hash {
                try db.run("UPDATE operators SET password_hash = ? WHERE name = ?", [.text(hash), .text(name)])
                try db.run("DELETE FROM operator_sessions WHERE name = ?", [.text(name)])
            }
            return true
        }
    }

    /// Deletes an account and its sessions; false if there was none.
    func deleteOperator(_ name: String) throws(StoreError) -> Bool {
        try transaction { () throws(StoreError) -> Bool in
            try db.run("DELETE FROM operator_sessions WHERE name = ?", [.text(name)])
            return try db.run("DELETE FROM operators WHERE name = ?", [.text(name)]) == 1
        }
    }

    // MARK: Sessions

    struct SessionRow: Equatable {
        var name: String
        var role: Role
        var csrf: String
        var createdMs: Int64
        var lastSeenMs: Int64
    }

    /// Stores a new session (and the account's last login).
    func createSession(idHash: String, name: String, role: Role, csrf: String, now: Int64) throws(StoreError) {
        try transaction { () throws(StoreError) in
            try db.run(
                "INSERT INTO operator_sessions (id_hash, name, role, csrf, created_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?)",
                [.text(idHash), .text(name), .text(role.rawValue), .text(csrf), .int(now), .int(now)])
            try db.run("UPDATE operators SET last_login_at = ? WHERE name = ?", [.int(now), .text(name)])
        }
    }

    func session(idHash: String) throws(StoreError) -> SessionRow? {
        guard
            let r = try db.query(
                "SELECT name, role, csrf, created_at, last_seen_at FROM operator_sessions WHERE id_hash = ?", [.text(idHash)]
            ).first, let role = Role(rawValue: r[1].text ?? "")
        else { return nil }
        return SessionRow(name: r[0].text ?? "", role: role, csrf: r[2].text ?? "", createdMs: r[3].int ?? 0, lastSeenMs: r[4].int ?? 0)
    }

    func touchSession(idHash: String, now: Int64) throws(StoreError) {
        try db.run("UPDATE operator_sessions SET last_seen_at = ? WHERE id_hash = ?", [.int(now), .text(idHash)])
    }

    func deleteSession(idHash: String) throws(StoreError) {
        try db.run("DELETE FROM operator_sessions WHERE id_hash = ?", [.text(idHash)])
    }

    /// Deletes sessions idle since before `idleBefore` or created before `createdBefore`.
    func purgeSessions(idleBefore: Int64, createdBefore: Int64) throws(StoreError) {
        try db.run(
            "DELETE FROM operator_sessions WHERE last_seen_at < ? OR created_at < ?", [.int(idleBefore), .int(createdBefore)])
    }

    // MARK: Audit log

    struct AuditRow: Equatable {
        var id: Int64
        var timeMs: Int64
        var actor: String
        var action: String
        var target: String
        var detail: String
    }

    func appendAudit(timeMs: Int64, actor: String, action: String, target: String, detail: String) throws(StoreError) {
        try db.run(
            "INSERT INTO audit_log (time_ms, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
            [.int(timeMs), .text(actor), .text(action), .text(target), .text(detail)])
    }

    /// Newest first, ids below `before`, optionally of one actor and/or action (each filter an
    /// index range: `audit_log_actor`, `audit_log_action`).
    func audit(actor: String?, action: String?, before: Int64, limit: Int) throws(StoreError) -> [AuditRow] {
        var sql = "SELECT id, time_ms, actor, action, target, detail FROM audit_log WHERE id < ?"
        var binds: [SQLBind] = [.int(before)]
        if let actor {
            sql += " AND actor = ?"
            binds.append(.text(actor))
        }
        if let action {
            sql += " AND action = ?"
            binds.append(.text(action))
        }
        sql += " ORDER BY id DESC LIMIT ?"
        binds.append(.int(Int64(limit)))
        return try db.query(sql, binds).map {
            AuditRow(
                id: $0[0].int ?? 0, timeMs: $0[1].int ?? 0, actor: $0[2].text ?? "", action: $0[3].text ?? "", target: $0[4].text ?? "",
                detail: $0[5].text ?? "null")
        }
    }

    // MARK: Instances and devices' last use

    /// Writes this instance's heartbeat and forgets instances not seen since `forgetBefore`.
    func heartbeat(instance: String, startedMs: Int64, now: Int64, forgetBefore: Int64) throws(StoreError) {
        try db.run("DELETE FROM backend_instances WHERE last_seen_at < ?", [.int(forgetBefore)])
        try db.run(
            """
            INSERT INTO backend_instances (id, started_at, last_seen_at) VALUES (?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
            """, [.text(instance), .int(startedMs), .int(now)])
    }

    /// Instances seen since `since`.
    func instances(since: Int64) throws(StoreError) -> [(id: String, lastSeenMs: Int64)] {
        try db.query("SELECT id, last_seen_at FROM backend_instances WHERE last_seen_at >= ? ORDER BY id", [.int(since)]).map {
            ($0[0].text ?? "", $0[1].int ?? 0)
        }
    }

    func deviceSeen(_ deviceId: String, now: Int64) throws(StoreError) {
        try db.run(
            """
            INSERT INTO device_seen (device_id, last_seen_at) VALUES (?, ?)
            ON CONFLICT (device_id) DO UPDATE SET last_seen_at = excluded.last_seen_at
            """, [.text(deviceId), .int(now)])
    }

    // MARK: Queries for the console's pages

    func consoleQuery(_ sql: String, _ binds: [SQLBind] = []) throws(StoreError) -> [[SQLValue]] { try db.query(sql, binds) }

    func consoleScalar(_ sql: String, _ binds: [SQLBind] = []) throws(StoreError) -> Int64 {
        try db.query(sql, binds).first?.first?.int ?? 0
    }

    func recordGTMActor(_ id: String, version: Int64, actor: String) throws(StoreError) {
        try db.run(
            "INSERT INTO gtm_version_actors (container_id, version, actor) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [.text(id), .int(version), .text(actor)])
    }
}
