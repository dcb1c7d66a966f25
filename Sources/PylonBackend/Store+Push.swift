import PylonCore
import PylonStore

/// The push tables.
///
/// - `push_devices`: one row per device token, with the install id that registered it (an
///   install keeps its token unless it asks for a new one; the old token is then retired).
/// - `push_bindings`: the real service's model: a device token is bound to at most one user
///   (binding another replaces it), a user to any number of devices.
/// - `push_activities`: a Live Activity id → its push token, the device and app that bound it.
/// - `push_sends`: every accepted send; `(app_id, target_type, target, msg_key)` is unique, so a
///   repeated msgKey for the same target is a duplicate and is not published again.
/// - `push_deliveries`: per send and device: published, accepted by the broker (PUBACK) and
///   acknowledged by the app on that device (the plugin reports acks over MQTT).
extension Store {
    static let pushSchema = """
        CREATE TABLE IF NOT EXISTS push_devices (
            token TEXT PRIMARY KEY,
            install_id TEXT NOT NULL,
            active INTEGER NOT NULL DEFAULT 1,
            registered_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS push_devices_install ON push_devices(install_id);
        CREATE TABLE IF NOT EXISTS push_bindings (
            token TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            bound_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS push_bindings_user ON push_bindings(user_id);
        CREATE TABLE IF NOT EXISTS push_activities (
            activity_id TEXT PRIMARY KEY,
            push_token TEXT NOT NULL,
            token TEXT NOT NULL,
            app_id TEXT NOT NULL,
            bound_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS push_sends (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            msg_id TEXT NOT NULL UNIQUE,
            app_id TEXT NOT NULL,
            target_type TEXT NOT NULL,
            target TEXT NOT NULL,
            msg_key TEXT,
            payload TEXT NOT NULL,
            devices INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            UNIQUE (app_id, target_type, target, msg_key)
        );
        CREATE TABLE IF NOT EXISTS push_deliveries (
            msg_id TEXT NOT NULL,
            token TEXT NOT NULL,
            published_at INTEGER NOT NULL,
            puback_at INTEGER,
            acked_at INTEGER,
            PRIMARY KEY (msg_id, token)
        );
        """

    static let pushReset = """
        DELETE FROM push_devices; DELETE FROM push_bindings; DELETE FROM push_activities;
        DELETE FROM push_sends; DELETE FROM push_deliveries;
        """

    /// The install's token: its current one, a new one when `renew`, or `given` (a token the
    /// device obtained elsewhere) which then replaces the current one.
    func pushRegister(installId: String, renew: Bool, given: String? = nil, now: Int64) throws(StoreError) -> (
        token: String, previous: String?
    ) {
        let cur = try db.query("SELECT token FROM push_devices WHERE install_id = ? AND active = 1", [.text(installId)]).first?.first?.text
        if let cur, !renew, given == nil || given == cur { return (cur, nil) }
        let token = given ?? System.randomHex(32)
        try db.run("DELETE FROM push_devices WHERE token = ?", [.text(token)])
        if let cur {
            try db.run("UPDATE push_devices SET active = 0 WHERE token = ?", [.text(cur)])
            try db.run("DELETE FROM push_bindings WHERE token = ?", [.text(cur)])
        }
        try db.run(
            "INSERT INTO push_devices (token, install_id, registered_at) VALUES (?, ?, ?)",
            [.text(token), .text(installId), .int(now)])
        return (token, cur)
    }

    func pushDeviceActive(_ token: String) throws(StoreError) -> Bool {
        !(try db.query("SELECT 1 FROM push_devices WHERE token = ? AND active = 1", [.text(token)])).isEmpty
    }

    /// Binds `token` to `userId`; answers the user it was bound to before (if another).
    func pushBind(token: String, userId: String, now: Int64) throws(StoreError) -> String? {
        let prev = try db.query("SELECT user_id FROM push_bindings WHERE token = ?", [.text(token)]).first?.first?.text
        try db.run(
            """
            INSERT INTO push_bindings (token, user_id, bound_at) VALUES (?, ?, ?)
            ON CONFLICT (token) DO UPDATE SET user_id = excluded.user_id, bound_at = excluded.bound_at
            """, [.text(token), .text(userId), .int(now)])
        return prev == userId ? nil : prev
    }

    func pushUnbind(token: String, userId: String) throws(StoreError) -> Bool {
        try db.run("DELETE FROM push_bindings WHERE token = ? AND user_id = ?", [.text(token), .text(userId)]) > 0
    }

    func pushBindActivity(activityId: String, pushToken: String, token: String, appId: String, now: Int64) throws(StoreError) {
        try db.run(
            """
            INSERT INTO push_activities (activity_id, push_token, token, app_id, bound_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (activity_id) DO UPDATE SET
                push_token = excluded.push_token, token = excluded.token, app_id = excluded.app_id, bound_at = excluded.bound_at
            """, [.text(activityId), .text(pushToken), .text(token), .text(appId), .int(now)])
    }

    /// The active push tokens a target resolves to, each with the device id of its install
    /// (whose topic carries the message), and for an activity the app that bound it. Tokens of
    /// installs without a device (none since device registration is required) are left out.
    func pushResolve(targetType: String, target: String) throws(StoreError) -> (
        devices: [(token: String, deviceId: String)], appId: String?
    ) {
        let join = """
            SELECT p.token, d.device_id FROM push_devices p JOIN devices d ON d.install_id = p.install_id
            WHERE p.active = 1
            """
        func rows(_ sql: String, _ args: [SQLBind]) throws(StoreError) -> [(token: String, deviceId: String)] {
            try db.query(sql, args).compactMap { r in r[0].text.flatMap { t in r[1].text.map { (t, $0) } } }
        }
        switch targetType {
        case "device":
            return (try rows(join + " AND p.token = ?", [.text(target)]), nil)
        case "user":
            return (
                try rows(
                    join + " AND p.token IN (SELECT token FROM push_bindings WHERE user_id = ?) ORDER BY p.token", [.text(target)]),
                nil
            )
        case "activity":
            guard let r = try db.query("SELECT token, app_id FROM push_activities WHERE activity_id = ?", [.text(target)]).first else {
                return ([], nil)
            }
            return (try rows(join + " AND p.token = ?", [SQLBind(r[0])]), r[1].text)
        default:  // broadcast: every active device
            return (try rows(join + " ORDER BY p.token", []), nil)
        }
    }

    /// The install whose token holds Live Activity `activityId`, if any.
    func pushActivityInstall(_ activityId: String) throws(StoreError) -> String? {
        try db.query(
            "SELECT p.install_id FROM push_activities a JOIN push_devices p ON p.token = a.token WHERE a.activity_id = ?",
            [.text(activityId)]
        ).first?.first?.text
    }

    /// Records a device's acknowledgement of `msgId` (on whichever of its tokens it was sent to).
    func pushMarkAcked(msgId: String, deviceId: String, now: Int64) throws(StoreError) {
        try db.run(
            """
            UPDATE push_deliveries SET acked_at = coalesce(acked_at, ?) WHERE msg_id = ? AND token IN
                (SELECT p.token FROM push_devices p JOIN devices d ON d.install_id = p.install_id WHERE d.device_id = ?)
            """,
            [.int(now), .text(msgId), .text(deviceId)])
    }

    /// The msgId of an earlier send with the same app, target and msgKey.
    func pushExistingSend(appId: String, targetType: String, target: String, msgKey: String) throws(StoreError) -> String? {
        try db.query(
            "SELECT msg_id FROM push_sends WHERE app_id = ? AND target_type = ? AND target = ? AND msg_key = ?",
            [.text(appId), .text(targetType), .text(target), .text(msgKey)]
        ).first?.first?.text
    }

    func pushRecordSend(
        msgId: String, appId: String, targetType: String, target: String, msgKey: String?,
        payload: String, tokens: [String], now: Int64
    ) throws(StoreError) {
        try db.run(
            """
            INSERT INTO push_sends (msg_id, app_id, target_type, target, msg_key, payload, devices, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                .text(msgId), .text(appId), .text(targetType), .text(target), msgKey.map { .text($0) } ?? .null,
                .text(payload), .int(Int64(tokens.count)), .int(now),
            ])
        for t in tokens {
            try db.run(
                "INSERT INTO push_deliveries (msg_id, token, published_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [.text(msgId), .text(t), .int(now)])
        }
    }

    /// Marks every delivery of `msgId` (a broadcast: one publish for all of them).
    func pushMarkAll(_ column: String, msgId: String, now: Int64) throws(StoreError) {
        try db.run("UPDATE push_deliveries SET \(column) = coalesce(\(column), ?) WHERE msg_id = ?", [.int(now), .text(msgId)])
    }

    func pushMark(_ column: String, msgId: String, token: String, now: Int64) throws(StoreError) {
        try db.run(
            "UPDATE push_deliveries SET \(column) = coalesce(\(column), ?) WHERE msg_id = ? AND token = ?",
            [.int(now), .text(msgId), .text(token)])
    }

    /// Sends not yet acknowledged by their device (an active token of it), newest first, at
    /// most `limit`; `deviceId` nil: every device. With each its device id and payload.
    func pushUnacked(deviceId: String?, limit: Int) throws(StoreError) -> [(
        msgId: String, token: String, deviceId: String, payload: String
    )] {
        var sql = """
            SELECT d.msg_id, d.token, dv.device_id, s.payload FROM push_deliveries d
            JOIN push_sends s ON s.msg_id = d.msg_id
            JOIN push_devices p ON p.token = d.token AND p.active = 1
            JOIN devices dv ON dv.install_id = p.install_id
            WHERE d.acked_at IS NULL
            """
        var args: [SQLBind] = []
        if let deviceId {
            sql += " AND dv.device_id = ?"
            args.append(.text(deviceId))
        }
        sql += " ORDER BY d.published_at DESC LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).compactMap { r in
            guard let m = r[0].text, let t = r[1].text, let d = r[2].text, let p = r[3].text else { return nil }
            return (m, t, d, p)
        }
    }

    func pushQuery(_ sql: String, _ args: [SQLBind] = []) throws(StoreError) -> [[SQLValue]] { try db.query(sql, args) }
}
