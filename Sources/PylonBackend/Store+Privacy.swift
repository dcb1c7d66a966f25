import PylonCore
import PylonProtocol
import PylonStore

/// Opt-outs, per-AppKey privacy settings and retention (docs/SECURITY.md, "Opt-outs and
/// retention").
///
/// - `optouts`: a device reported a denied switch (a record on stream `pylon.consent`: `switch`
///   `ma:<appKey>`, `device`, `push` or `push:<name>`, `granted` false) — one row per AppKey
///   (`*` for the device's master switch and push switches, unless the record names `appKey`),
///   install and switch; a later `granted` true removes it.
/// - `app_settings`: `eraseOnOptOut` (an opt-out naming a user erases that user) and the
///   AppKey's retention (`maxAgeDays`).
/// - `stream_retention`: a stream's retention (`maxAgeDays`).
///
/// Retention is enforced by the periodic job, `RetentionLimits.batchRows` events (and their
/// records) per statement, oldest first, through the `(app_key, time_ms)` and
/// `(stream, time_ms)` indexes.
extension Store {
    static let privacySchema = """
        CREATE TABLE IF NOT EXISTS optouts (
            app_key TEXT NOT NULL,
            install_id TEXT NOT NULL,
            switch TEXT NOT NULL,
            euid TEXT NOT NULL,
            time_ms INTEGER NOT NULL,
            PRIMARY KEY (app_key, install_id, switch)
        );
        CREATE INDEX IF NOT EXISTS optouts_user ON optouts(app_key, euid);
        CREATE INDEX IF NOT EXISTS optouts_install ON optouts(install_id);
        CREATE INDEX IF NOT EXISTS optouts_time ON optouts(time_ms);
        CREATE TABLE IF NOT EXISTS app_settings (
            app_key TEXT PRIMARY KEY,
            erase_on_optout INTEGER NOT NULL DEFAULT 0,
            max_age_days INTEGER
        );
        CREATE TABLE IF NOT EXISTS stream_retention (
            stream TEXT PRIMARY KEY,
            max_age_days INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS jetstream_retention (
            stream TEXT PRIMARY KEY,
            max_age_days INTEGER NOT NULL
        );
        """

    struct AppSettings: Equatable {
        var eraseOnOptOut = false
        var maxAgeDays: Int64?

        var json: JSON { ["eraseOnOptOut": .bool(eraseOnOptOut), "maxAgeDays": maxAgeDays.map(JSON.int) ?? .null] }
    }

    func appSettings(_ appKey: String) throws(StoreError) -> AppSettings {
        guard let r = try db.query("SELECT erase_on_optout, max_age_days FROM app_settings WHERE app_key = ?", [.text(appKey)]).first
        else { return AppSettings() }
        return AppSettings(eraseOnOptOut: (r[0].int ?? 0) != 0, maxAgeDays: r[1].int)
    }

    func setAppSettings(_ appKey: String, _ s: AppSettings) throws(StoreError) {
        try db.run(
            """
            INSERT INTO app_settings (app_key, erase_on_optout, max_age_days) VALUES (?, ?, ?)
            ON CONFLICT (app_key) DO UPDATE SET erase_on_optout = excluded.erase_on_optout, max_age_days = excluded.max_age_days
            """, [.text(appKey), .int(s.eraseOnOptOut ? 1 : 0), s.maxAgeDays.map { .int($0) } ?? .null])
    }

    /// Every AppKey's and stream's retention (bounded: one row per AppKey or stream an admin set).
    func retention() throws(StoreError) -> (apps: [(String, Int64)], streams: [(String, Int64)]) {
        let apps = try db.query(
            "SELECT app_key, max_age_days FROM app_settings WHERE max_age_days IS NOT NULL ORDER BY app_key LIMIT ?",
            [.int(Int64(RetentionLimits.maxRules))]
        ).compactMap { r in r[0].text.flatMap { a in r[1].int.map { (a, $0) } } }
        let streams = try db.query(
            "SELECT stream, max_age_days FROM stream_retention ORDER BY stream LIMIT ?", [.int(Int64(RetentionLimits.maxRules))]
        ).compactMap { r in r[0].text.flatMap { s in r[1].int.map { (s, $0) } } }
        return (apps, streams)
    }

    func setAppRetention(_ appKey: String, days: Int64?) throws(StoreError) {
        try db.run(
            """
            INSERT INTO app_settings (app_key, max_age_days) VALUES (?, ?)
            ON CONFLICT (app_key) DO UPDATE SET max_age_days = excluded.max_age_days
            """, [.text(appKey), days.map { .int($0) } ?? .null])
    }

    func setStreamRetention(_ stream: String, days: Int64?) throws(StoreError) {
        if let days {
            try db.run(
                """
                INSERT INTO stream_retention (stream, max_age_days) VALUES (?, ?)
                ON CONFLICT (stream) DO UPDATE SET max_age_days = excluded.max_age_days
                """, [.text(stream), .int(days)])
        } else {
            try db.run("DELETE FROM stream_retention WHERE stream = ?", [.text(stream)])
        }
    }

    /// The `max_age` (days) set for JetStream stream `name` (`PUT /v1/admin/retention`
    /// `natsMaxAgeDays`), if any.
    func jetStreamMaxAgeDays(_ name: String) throws(StoreError) -> Int64? {
        try db.query("SELECT max_age_days FROM jetstream_retention WHERE stream = ?", [.text(name)]).first?.first?.int
    }

    func setJetStreamMaxAgeDays(_ name: String, _ days: Int64?) throws(StoreError) {
        if let days {
            try db.run(
                """
                INSERT INTO jetstream_retention (stream, max_age_days) VALUES (?, ?)
                ON CONFLICT (stream) DO UPDATE SET max_age_days = excluded.max_age_days
                """, [.text(name), .int(days)])
        } else {
            try db.run("DELETE FROM jetstream_retention WHERE stream = ?", [.text(name)])
        }
    }

    /// Deletes at most `RetentionLimits.batchRows` events (and their records) older than
    /// `cutoffMs` of one AppKey (`appKey`) or stream (`stream`); answers how many.
    func expireEvents(appKey: String? = nil, stream: String? = nil, before cutoffMs: Int64) throws(StoreError) -> Int {
        try transaction { () throws(StoreError) -> Int in
            // The oldest expired batch, named by the same subquery in both statements (one
            // transaction: both see the same rows).
            let batch: String
            let args: [SQLBind]
            if let appKey {
                batch = "SELECT id FROM events WHERE app_key = ? AND time_ms < ? ORDER BY time_ms LIMIT ?"
                args = [.text(appKey), .int(cutoffMs), .int(Int64(RetentionLimits.batchRows))]
            } else if let stream, let sid = try db.query("SELECT id FROM streams WHERE name = ?", [.text(stream)]).first?.first?.int {
                batch = "SELECT id FROM events WHERE stream = ? AND time_ms < ? ORDER BY time_ms LIMIT ?"
                args = [.int(sid), .int(cutoffMs), .int(Int64(RetentionLimits.batchRows))]
            } else {
                return 0
            }
            try db.run(
                "DELETE FROM records WHERE seq IN (SELECT r.seq FROM events e JOIN records r ON r.stream = e.stream"
                    + " AND r.id = e.record_id WHERE e.id IN (\(batch)))", args)
            return try db.run("DELETE FROM events WHERE id IN (\(batch))", args)
        }
    }

    // MARK: Opt-outs

    struct OptOutRow: Equatable {
        var appKey: String
        var euid: String
        var installId: String
        var switchName: String
        var timeMs: Int64

        var json: JSON {
            [
                "appKey": .string(appKey), "euid": euid.isEmpty ? .null : .string(euid), "installId": .string(installId),
                "switch": .string(switchName), "timeMs": .int(timeMs),
            ]
        }
    }

    /// Applies the consent records of a batch (stream `ConsentStream.name`): a denial is kept, a
    /// grant removes it. Answers the users to erase (`eraseOnOptOut`).
    func applyConsent(_ records: [IndexedRecord], installId: String) throws(StoreError) -> [(appKey: String, euid: String)] {
        var erase: [(String, String)] = []
        for r in records {
            guard let sw = r.consentSwitch, let granted = r.granted else { continue }
            let appKey: String
            if sw == "device" || sw == "push" || sw.hasPrefix("push:") {
                appKey = r.consentAppKey ?? "*"
            } else if sw.hasPrefix("ma:"), AppKey.isValid(String(sw.dropFirst(3))) {
                appKey = String(sw.dropFirst(3))
            } else {
                continue
            }
            if granted {
                try db.run(
                    "DELETE FROM optouts WHERE app_key = ? AND install_id = ? AND switch = ?", [.text(appKey), .text(installId), .text(sw)])
                continue
            }
            var euid = r.euid
            if euid.isEmpty, appKey != "*", !installId.isEmpty {
                // The uploader's report names no user: the user of the install's latest event of
                // that AppKey (an index seek: `(install_id, app_key, time_ms)`).
                euid =
                    try db.query(
                        "SELECT euid FROM events WHERE install_id = ? AND app_key = ? AND euid <> '' ORDER BY time_ms DESC LIMIT 1",
                        [.text(installId), .text(appKey)]
                    ).first?.first?.text ?? ""
            }
            try db.run(
                """
                INSERT INTO optouts (app_key, install_id, switch, euid, time_ms) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (app_key, install_id, switch) DO UPDATE SET euid = excluded.euid, time_ms = excluded.time_ms
                """, [.text(appKey), .text(installId), .text(sw), .text(euid), .int(r.timeMs)])
            if !euid.isEmpty, appKey != "*", try appSettings(appKey).eraseOnOptOut { erase.append((appKey, euid)) }
        }
        return erase
    }

    /// Opt-outs newest first; `appKey` filters; the cursor is the last row's time and key.
    func optOuts(appKey: String?, before: Int64, limit: Int) throws(StoreError) -> [OptOutRow] {
        var sql = "SELECT app_key, euid, install_id, switch, time_ms FROM optouts WHERE time_ms < ?"
        var args: [SQLBind] = [.int(before)]
        if let appKey {
            sql += " AND app_key = ?"
            args.append(.text(appKey))
        }
        sql += " ORDER BY time_ms DESC LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).map {
            OptOutRow(
                appKey: $0[0].text ?? "", euid: $0[1].text ?? "", installId: $0[2].text ?? "", switchName: $0[3].text ?? "",
                timeMs: $0[4].int ?? 0)
        }
    }

    /// The user's opt-out (the newest), if any.
    func optOut(appKey: String, euid: String) throws(StoreError) -> OptOutRow? {
        try db.query(
            "SELECT app_key, euid, install_id, switch, time_ms FROM optouts WHERE app_key = ? AND euid = ? ORDER BY time_ms DESC LIMIT 1",
            [.text(appKey), .text(euid)]
        ).first.map {
            OptOutRow(
                appKey: $0[0].text ?? "", euid: $0[1].text ?? "", installId: $0[2].text ?? "", switchName: $0[3].text ?? "",
                timeMs: $0[4].int ?? 0)
        }
    }
}

/// The stream devices report consent changes on (the uploader keeps them while offline).
enum ConsentStream {
    static let name = "pylon.consent"
}

enum RetentionLimits {
    /// Events deleted per retention statement.
    static let batchRows = 1000
    /// Retention rules (AppKeys plus streams) enforced at most.
    static let maxRules = 1000
    /// Largest `maxAgeDays`.
    static let maxDays: Int64 = 36_500
    /// Retention runs every this many job rounds (`DataLimits.jobIntervalMs` each).
    static let everyRounds = 25
    /// Batches deleted per retention round at most (each rule gets one until it has none).
    static let batchesPerRound = 8
}
