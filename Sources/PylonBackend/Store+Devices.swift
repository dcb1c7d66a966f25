import PylonStore

/// Registered devices: one row per install, with the secret of its device token
/// (`pd1.<device_id>.<secret>`). The reference backend keeps the secret as issued in its
/// owner-only database (`Store.fileMode`); `POST /v1/admin/reset` does not remove devices, so
/// their credentials outlive a reset of the data.
///
/// `device_apps`: the MA AppKeys a device declared with its own token (an MA call for the
/// AppKey, `Backend+Devices.swift`): its token may ingest into `ma.<appKey>` only then.
/// `device_reenrolments`: an operator's approval for the enrolment secret to register an
/// existing install once more (`POST /v1/admin/devices/{installId}/reenrol`), until it expires.
/// Both outlive a reset, as devices do.
extension Store {
    static let devicesSchema = """
        CREATE TABLE IF NOT EXISTS devices (
            device_id TEXT PRIMARY KEY,
            install_id TEXT NOT NULL UNIQUE,
            secret TEXT NOT NULL,
            created_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS device_apps (
            device_id TEXT NOT NULL,
            app_key TEXT NOT NULL,
            registered_at INTEGER NOT NULL,
            PRIMARY KEY (device_id, app_key)
        );
        CREATE TABLE IF NOT EXISTS device_reenrolments (
            install_id TEXT PRIMARY KEY,
            approved_by TEXT NOT NULL,
            expires_at INTEGER NOT NULL
        );
        """

    struct DeviceRow: Equatable {
        var installId: String
        var secret: String
    }

    func device(_ id: String) throws(StoreError) -> DeviceRow? {
        guard let r = try db.query("SELECT install_id, secret FROM devices WHERE device_id = ?", [.text(id)]).first,
            let i = r[0].text, let s = r[1].text
        else { return nil }
        return DeviceRow(installId: i, secret: s)
    }

    func deviceId(installId: String) throws(StoreError) -> String? {
        try db.query("SELECT device_id FROM devices WHERE install_id = ?", [.text(installId)]).first?.first?.text
    }

    /// Creates the device of a new install: `(deviceId, secret, created)`. When the install was
    /// registered meanwhile (another request, on this instance or another, won the race for its
    /// unique `install_id`), nothing is written and the winner's row is answered
    /// (`created: false`): `ON CONFLICT DO NOTHING` waits for the winner's commit, so neither
    /// request sees a unique violation.
    func createDevice(id: String, installId: String, secret: String, now: Int64) throws(StoreError) -> (
        deviceId: String, secret: String, created: Bool
    ) {
        let n = try db.run(
            "INSERT INTO devices (device_id, install_id, secret, created_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [.text(id), .text(installId), .text(secret), .int(now)])
        if n > 0 { return (id, secret, true) }
        guard let r = try db.query("SELECT device_id, secret FROM devices WHERE install_id = ?", [.text(installId)]).first,
            let d = r[0].text, let s = r[1].text
        else { throw .busy("install \(installId) was neither created nor found; retry") }
        return (d, s, false)
    }

    /// Gives device `id` a new secret (its old token stops working).
    func renewDevice(id: String, secret: String) throws(StoreError) {
        try db.run("UPDATE devices SET secret = ? WHERE device_id = ?", [.text(secret), .text(id)])
    }

    /// An operator's approval for the enrolment secret to register `installId` again once,
    /// until `expiresAt` (a later approval replaces it).
    func approveReenrolment(installId: String, by actor: String, expiresAt: Int64) throws(StoreError) {
        try db.run(
            """
            INSERT INTO device_reenrolments (install_id, approved_by, expires_at) VALUES (?, ?, ?)
            ON CONFLICT (install_id) DO UPDATE SET approved_by = excluded.approved_by, expires_at = excluded.expires_at
            """, [.text(installId), .text(actor), .int(expiresAt)])
    }

    /// Consumes `installId`'s unexpired approval: true when there was one (one use: the delete
    /// of two concurrent requests succeeds for one).
    func takeReenrolment(installId: String, now: Int64) throws(StoreError) -> Bool {
        try db.run("DELETE FROM device_reenrolments WHERE install_id = ? AND expires_at > ?", [.text(installId), .int(now)]) > 0
    }

    /// Records that device `id` declared `appKey` (idempotent).
    func registerApp(deviceId id: String, appKey: String, now: Int64) throws(StoreError) {
        try db.run(
            "INSERT INTO device_apps (device_id, app_key, registered_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [.text(id), .text(appKey), .int(now)])
    }

    /// Whether device `id` declared `appKey`.
    func appRegistered(deviceId id: String, appKey: String) throws(StoreError) -> Bool {
        !(try db.query("SELECT 1 FROM device_apps WHERE device_id = ? AND app_key = ?", [.text(id), .text(appKey)])).isEmpty
    }

    func deviceCount() throws(StoreError) -> Int64 {
        try db.query("SELECT count(*) FROM devices").first?.first?.int ?? 0
    }

    /// Whether push token `token` is an active token of install `installId`.
    func pushTokenBelongs(_ token: String, installId: String) throws(StoreError) -> Bool {
        !(try db.query("SELECT 1 FROM push_devices WHERE token = ? AND install_id = ? AND active = 1", [.text(token), .text(installId)]))
            .isEmpty
    }
}
