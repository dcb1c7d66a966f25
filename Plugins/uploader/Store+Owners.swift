import PylonCore
import PylonStore

/// Stream owners and saved settings: the SQLite database beside the segments.
extension UploaderStore {
    /// Records `owner` as the owner of `stream` (the first writer wins; later calls change nothing).
    func recordOwner(stream: String, owner: String, nowMs: Int64) throws {
        try db.run(
            "INSERT OR IGNORE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
    }

    /// Hands `stream` to `owner` (`uploader.setOwner`), or releases it (nil: the next writer
    /// claims it).
    func setOwner(stream: String, owner: String?, nowMs: Int64) throws {
        if let owner {
            try db.run(
                "INSERT OR REPLACE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
        } else {
            try db.run("DELETE FROM stream_owners WHERE stream = ?", [.text(stream)])
        }
    }

    func recordedOwners() throws -> [String: String] {
        var out: [String: String] = [:]
        for r in try db.query("SELECT stream, owner FROM stream_owners") { out[r[0].text ?? ""] = r[1].text ?? "" }
        return out
    }

    func saveSettings(stream: String, maxCount: Int, intervalMs: UInt64) throws {
        try db.run(
            "INSERT OR REPLACE INTO stream_settings(stream,max_count,interval_ms,endpoint) VALUES(?,?,?,NULL)",
            [.text(stream), .int(Int64(maxCount)), .int(Int64(intervalMs))])
    }

    func savedSettings() throws -> [String: (maxCount: Int, intervalMs: UInt64)] {
        var out: [String: (Int, UInt64)] = [:]
        for r in try db.query("SELECT stream,max_count,interval_ms FROM stream_settings") {
            out[r[0].text ?? ""] = (Int(r[1].int ?? 50), UInt64(r[2].int ?? 10_000))
        }
        return out
    }
}
