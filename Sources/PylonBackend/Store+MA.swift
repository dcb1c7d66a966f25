import PylonCore
import PylonStore

/// The MA tables: the per-AppKey state, and each AppKey's identity graph and user data.
///
/// - `ma_apps`: `disabled`, `project` and the metadata (JSON) of AppKeys set by an admin call;
///   an AppKey without a row has the defaults.
/// - `ma_users`: one row per EUID, with its contacts and properties as JSON objects.
/// - `ma_identities`: every identifier (`user_id`, `anonymous_id`, `email`, `phone`, `device`)
///   and the EUID holding it; a value belongs to at most one user per AppKey. `seq` keeps
///   attach order.
/// - `ma_channel_values`: one row per channel call, in call order.
///
/// The methods are the primitives `MACalls` runs inside one transaction per request.
extension Store {
    static let maSchema = """
        CREATE TABLE IF NOT EXISTS ma_apps (
            app_key TEXT PRIMARY KEY,
            disabled INTEGER NOT NULL DEFAULT 0,
            project TEXT NOT NULL DEFAULT 'default',
            metadata TEXT NOT NULL DEFAULT '{"properties":{}}'
        );
        CREATE TABLE IF NOT EXISTS ma_users (
            app_key TEXT NOT NULL,
            euid TEXT NOT NULL,
            contacts TEXT NOT NULL DEFAULT '{}',
            properties TEXT NOT NULL DEFAULT '{}',
            created_at INTEGER NOT NULL,
            PRIMARY KEY (app_key, euid)
        );
        CREATE TABLE IF NOT EXISTS ma_identities (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            app_key TEXT NOT NULL,
            kind TEXT NOT NULL,
            value TEXT NOT NULL,
            euid TEXT NOT NULL,
            UNIQUE (app_key, kind, value)
        );
        CREATE INDEX IF NOT EXISTS ma_identities_user ON ma_identities(app_key, euid);
        CREATE TABLE IF NOT EXISTS ma_channel_values (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            app_key TEXT NOT NULL,
            euid TEXT NOT NULL,
            channel_id INTEGER NOT NULL,
            vals TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS ma_channel_values_user ON ma_channel_values(app_key, euid);
        """

    static let maReset = """
        DELETE FROM ma_apps; DELETE FROM ma_users; DELETE FROM ma_identities; DELETE FROM ma_channel_values;
        """

    /// The admin-set state of an AppKey.
    struct MAApp: Equatable {
        var disabled = false
        var project = "default"
        var metadata = MAMetadata()

        func json(appKey: String) -> JSON {
            [
                "appKey": .string(appKey), "disabled": .bool(disabled), "project": .string(project),
                "metadata": metadata.json,
            ]
        }
    }

    /// A user's JSON documents in `ma_users`.
    enum MADocument: String {
        case contacts, properties
    }

    // MARK: AppKey state

    /// The AppKey's state; its metadata is parsed only when `withMetadata` (only property calls
    /// and the admin API use it, and every MA call reads `disabled` and `project`).
    func maApp(_ appKey: String, withMetadata: Bool = true) throws(StoreError) -> MAApp {
        let sql =
            withMetadata
            ? "SELECT disabled, project, metadata FROM ma_apps WHERE app_key = ?"
            : "SELECT disabled, project FROM ma_apps WHERE app_key = ?"
        guard let row = try db.query(sql, [.text(appKey)]).first else { return MAApp() }
        return MAApp(
            disabled: row[0].int != 0, project: row[1].text ?? "default",
            metadata: withMetadata ? MAMetadata.stored(row[2].text ?? "") : MAMetadata())
    }

    func setMAApp(_ appKey: String, _ app: MAApp) throws(StoreError) {
        try db.run(
            """
            INSERT INTO ma_apps (app_key, disabled, project, metadata) VALUES (?, ?, ?, ?)
            ON CONFLICT (app_key) DO UPDATE SET
                disabled = excluded.disabled, project = excluded.project, metadata = excluded.metadata
            """, [.text(appKey), .int(app.disabled ? 1 : 0), .text(app.project), .text(app.metadata.json.serialized)])
    }

    // MARK: Identity graph

    func maUserExists(_ appKey: String, _ euid: String) throws(StoreError) -> Bool {
        !(try db.query("SELECT 1 FROM ma_users WHERE app_key = ? AND euid = ?", [.text(appKey), .text(euid)])).isEmpty
    }

    /// The EUID holding identifier `value` of `kind`, if any.
    func maHolder(_ appKey: String, _ kind: IdentityKind, _ value: String) throws(StoreError) -> String? {
        try db.query(
            "SELECT euid FROM ma_identities WHERE app_key = ? AND kind = ? AND value = ?",
            [.text(appKey), .text(kind.rawValue), .text(value)]
        ).first?[0].text
    }

    /// Every identifier of a user, by kind, in attach order.
    func maIdentities(_ appKey: String, _ euid: String) throws(StoreError) -> [IdentityKind: [String]] {
        var out: [IdentityKind: [String]] = [:]
        for row in try db.query(
            "SELECT kind, value FROM ma_identities WHERE app_key = ? AND euid = ? ORDER BY seq",
            [.text(appKey), .text(euid)])
        {
            guard let kind = row[0].text.flatMap(IdentityKind.init(rawValue:)), let v = row[1].text else { continue }
            out[kind, default: []].append(v)
        }
        return out
    }

    /// What resolving `valid` needs to know: the holder of each value and the single-valued
    /// identifiers of each user involved.
    func maGraphView(_ appKey: String, _ valid: [IdentityKind: String], current: String?) throws(StoreError) -> IdentityGraphView {
        var view = IdentityGraphView(current: current)
        for (kind, value) in valid {
            if let h = try maHolder(appKey, kind, value) { view.holder[kind] = h }
        }
        for euid in Set(view.holder.values).union(current.map { [$0] } ?? []) {
            let ids = try maIdentities(appKey, euid)
            view.users[euid] = IdentityGraphView.Keys(userID: ids[.userID]?.first, anonymousID: ids[.anonymousID]?.first)
        }
        return view
    }

    /// Creates a user with a new random EUID (32 lower-case hex digits) and returns it.
    func maCreateUser(_ appKey: String, at now: Int64) throws(StoreError) -> String {
        var euid = ""
        repeat {
            euid = System.randomHex(16)
        } while try maUserExists(appKey, euid)
        try db.run(
            "INSERT INTO ma_users (app_key, euid, created_at) VALUES (?, ?, ?)",
            [.text(appKey), .text(euid), .int(now)])
        return euid
    }

    /// Attaches an identifier that no user holds.
    func maAttach(_ appKey: String, _ euid: String, _ kind: IdentityKind, _ value: String) throws(StoreError) {
        try db.run(
            "INSERT INTO ma_identities (app_key, kind, value, euid) VALUES (?, ?, ?, ?)",
            [.text(appKey), .text(kind.rawValue), .text(value), .text(euid)])
    }

    /// Binds a device to a user, moving it from any other user (it becomes the user's latest
    /// device: a new `seq`).
    func maBindDevice(_ appKey: String, _ deviceID: String, to euid: String) throws(StoreError) {
        try db.run(
            "DELETE FROM ma_identities WHERE app_key = ? AND kind = 'device' AND value = ?", [.text(appKey), .text(deviceID)])
        try db.run(
            "INSERT INTO ma_identities (app_key, kind, value, euid) VALUES (?, 'device', ?, ?)",
            [.text(appKey), .text(deviceID), .text(euid)])
    }

    /// The advisory lock keys of an identity merge (`Store.transaction(locking:)`): each
    /// identifier a start or identify names, its device and its EUID. Two instances resolving
    /// the same identifiers at once then run one after the other.
    static func maLockKeys(_ appKey: String, _ body: JSON) -> [Int64] {
        var keys: [Int64] = []
        if let d = body["deviceId"]?.stringValue { keys.append(lockKey("ma", appKey, IdentityKind.device.rawValue, d)) }
        if let e = body["euid"]?.stringValue { keys.append(lockKey("ma", appKey, "euid", e)) }
        if let identity = body["identity"]?.objectValue {
            for kind in IdentityKind.sendable {
                guard let v = identity[kind.rawValue]?.stringValue else { continue }
                keys.append(lockKey("ma", appKey, kind.rawValue, kind == .email ? v.lowercased() : v))
            }
        }
        return keys
    }

    // MARK: User data

    /// A user's document; nil when the user does not exist (unreadable JSON counts as `{}`).
    func maDocument(_ appKey: String, _ euid: String, _ doc: MADocument) throws(StoreError) -> JSONObject? {
        guard
            let row = try db.query(
                "SELECT \(doc.rawValue) FROM ma_users WHERE app_key = ? AND euid = ?",
                [.text(appKey), .text(euid)]
            ).first
        else { return nil }
        return row[0].text.flatMap { try? JSON.parse($0, maxDepth: Limits.maxJSONDepth + 1).objectValue } ?? JSONObject()
    }

    func setMADocument(_ appKey: String, _ euid: String, _ doc: MADocument, _ value: JSONObject) throws(StoreError) {
        try db.run(
            "UPDATE ma_users SET \(doc.rawValue) = ? WHERE app_key = ? AND euid = ?",
            [.text(JSON.object(value).serialized), .text(appKey), .text(euid)])
    }

    func maAppendChannelValues(_ appKey: String, _ euid: String, channelID: Int64, _ values: [String]) throws(StoreError) {
        try db.run(
            "INSERT INTO ma_channel_values (app_key, euid, channel_id, vals) VALUES (?, ?, ?, ?)",
            [.text(appKey), .text(euid), .int(channelID), .text(JSON.array(values.map(JSON.string)).serialized)])
    }

    /// Every channel call of a user, in call order: `[{"channelId", "values"}]`.
    func maChannelValues(_ appKey: String, _ euid: String) throws(StoreError) -> [JSON] {
        try db.query(
            "SELECT channel_id, vals FROM ma_channel_values WHERE app_key = ? AND euid = ? ORDER BY seq",
            [.text(appKey), .text(euid)]
        ).map { row in
            let values = row[1].text.flatMap { try? JSON.parse($0) } ?? .array([])
            return ["channelId": .int(row[0].int ?? 0), "values": values]
        }
    }
}
