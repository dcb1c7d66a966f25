import PylonStore

/// Enrolment keys for batches of devices (`Backend+EnrolmentKeys.swift`): each is stored as the
/// SHA-256 of its secret, never the secret, with who made it, an optional expiry, an optional
/// number of devices it may register, and when it was revoked. `device_enrolments` says which
/// key registered which device. Both outlive a reset, as devices do.
extension Store {
    static let enrolmentSchema = """
        CREATE TABLE IF NOT EXISTS enrolment_keys (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            secret_hash TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER,
            max_devices INTEGER,
            devices INTEGER NOT NULL DEFAULT 0,
            revoked_at INTEGER
        );
        CREATE TABLE IF NOT EXISTS device_enrolments (
            device_id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL,
            enrolled_at INTEGER NOT NULL
        );
        """

    struct EnrolmentKeyRow: Equatable {
        var id: String
        var name: String
        var secretHash: String
        var createdBy: String
        var createdAt: Int64
        var expiresAt: Int64?
        var maxDevices: Int64?
        var devices: Int64
        var revokedAt: Int64?

        /// Why the key registers no device at `now`, or nil when it may.
        func refusal(now: Int64) -> String? {
            if revokedAt != nil { return "the enrolment key was revoked" }
            if let e = expiresAt, e <= now { return "the enrolment key expired" }
            if let m = maxDevices, devices >= m { return "the enrolment key registered its \(m) devices" }
            return nil
        }
    }

    private static let keyColumns = "id, name, secret_hash, created_by, created_at, expires_at, max_devices, devices, revoked_at"

    private static func keyRow(_ r: [SQLValue]) -> EnrolmentKeyRow? {
        guard let id = r[0].text, let name = r[1].text, let hash = r[2].text, let by = r[3].text, let at = r[4].int, let n = r[7].int
        else { return nil }
        return EnrolmentKeyRow(
            id: id, name: name, secretHash: hash, createdBy: by, createdAt: at, expiresAt: r[5].int, maxDevices: r[6].int,
            devices: n, revokedAt: r[8].int)
    }

    func createEnrolmentKey(_ k: EnrolmentKeyRow) throws(StoreError) {
        try db.run(
            "INSERT INTO enrolment_keys (\(Store.keyColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                .text(k.id), .text(k.name), .text(k.secretHash), .text(k.createdBy), .int(k.createdAt),
                k.expiresAt.map { .int($0) } ?? .null, k.maxDevices.map { .int($0) } ?? .null, .int(k.devices), .null,
            ])
    }

    func enrolmentKey(_ id: String) throws(StoreError) -> EnrolmentKeyRow? {
        try db.query("SELECT \(Store.keyColumns) FROM enrolment_keys WHERE id = ?", [.text(id)]).first.flatMap(Store.keyRow)
    }

    /// Every key, newest first (at most `limit`).
    func enrolmentKeys(limit: Int) throws(StoreError) -> [EnrolmentKeyRow] {
        try db.query("SELECT \(Store.keyColumns) FROM enrolment_keys ORDER BY created_at DESC, id LIMIT ?", [.int(Int64(limit))])
            .compactMap(Store.keyRow)
    }

    func enrolmentKeyCount() throws(StoreError) -> Int64 {
        try db.query("SELECT count(*) FROM enrolment_keys").first?.first?.int ?? 0
    }

    /// Revokes key `id` (the first revocation's time stays); false when there is no such key.
    func revokeEnrolmentKey(_ id: String, now: Int64) throws(StoreError) -> Bool {
        try db.run("UPDATE enrolment_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?", [.int(now), .text(id)]) > 0
    }

    /// Counts one device registered with key `id`, if the key still may (not revoked, not
    /// expired, under its device limit: checked in the same statement, so two registrations at
    /// once cannot both take the last place); records which key registered the device.
    func useEnrolmentKey(_ id: String, deviceId: String, now: Int64) throws(StoreError) -> Bool {
        let n = try db.run(
            """
            UPDATE enrolment_keys SET devices = devices + 1
            WHERE id = ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)
                AND (max_devices IS NULL OR devices < max_devices)
            """, [.text(id), .int(now)])
        guard n > 0 else { return false }
        try db.run(
            "INSERT INTO device_enrolments (device_id, key_id, enrolled_at) VALUES (?, ?, ?) ON CONFLICT (device_id) DO NOTHING",
            [.text(deviceId), .text(id), .int(now)])
        return true
    }

    /// The key that registered device `id`, if one did.
    func enrolmentKeyOf(deviceId id: String) throws(StoreError) -> String? {
        try db.query("SELECT key_id FROM device_enrolments WHERE device_id = ?", [.text(id)]).first?.first?.text
    }
}
