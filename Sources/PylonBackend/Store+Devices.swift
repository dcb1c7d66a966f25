import PylonStore

/// Registered devices: one row per install, with the secret of its device token
/// (`pd1.<device_id>.<secret>`). The reference backend keeps the secret as issued in its
/// owner-only database (`Store.fileMode`); `POST /v1/admin/reset` does not remove devices, so
/// their credentials outlive a reset of the data.
extension Store {
    static let devicesSchema = """
        CREATE TABLE IF NOT EXISTS devices (
            device_id TEXT PRIMARY KEY,
            install_id TEXT NOT NULL UNIQUE,
            secret TEXT NOT NULL,
            created_at INTEGER NOT NULL
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

    /// Creates the install's device, or gives it a new secret (the old token stops working).
    func saveDevice(id: String, installId: String, secret: String, now: Int64) throws(StoreError) {
        try db.run(
            """
            INSERT INTO devices (device_id, install_id, secret, created_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (device_id) DO UPDATE SET secret = excluded.secret
            """,
            [.text(id), .text(installId), .text(secret), .int(now)])
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
