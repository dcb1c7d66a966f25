/// Limits of the console's routes.
enum ConsoleLimits {
    /// `--console-dir`: files, bytes per file, bytes in all, directory depth.
    static let maxFiles = 512
    static let maxFileBytes = 4 << 20
    static let maxTotalBytes = 32 << 20
    static let maxDepth = 8
    /// Lists: `?limit=` default and maximum.
    static let defaultPage = 50
    static let maxPage = 500
    /// Cursors, in bytes (they are opaque keys the backend gave out).
    static let maxCursorBytes = 1024
    /// An audit entry's `detail`, serialised; larger details are replaced by a note.
    static let maxAuditDetailBytes = 4096
    /// How often `main` writes the instance heartbeat and deletes expired sessions.
    static let heartbeatMs: UInt64 = 10_000
    /// An instance not seen for this long is shown unhealthy; for `forgetInstanceMs`, removed.
    static let instanceStaleMs: Int64 = 30_000
    static let forgetInstanceMs: Int64 = 24 * 3_600_000
    /// A device's last use is written at most this often per instance (10,000 devices cost at
    /// most 33 writes a second; the console shows the last use to within this).
    static let deviceSeenWriteMs: Int64 = 300_000
    /// Devices whose last write time is kept (beyond, the table is cleared and rebuilt).
    static let maxDeviceSeenEntries = 100_000
    /// A device page's recent pushes and events, at most.
    static let deviceRecent = 20
    /// The security headers of every console, session and operator response.
    static let securityHeaders: [(String, String)] = [
        (
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                + "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
        ),
        ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
    ]
}
