import PylonCore
import PylonStore

/// The analytics rollups, kept at ingest from the records the event index took (so duplicates
/// count once):
///
/// - `event_hours`: per AppKey, hour (UTC, by event time) and event name, how many events;
///   counts over time and top events sum at most hours × names rows.
/// - `user_days`: per AppKey and day, each EUID that sent an event; unique users per day count
///   its rows. An erasure deletes the user's rows; `event_hours` holds no user.
///
/// A batch adds one upsert per distinct (hour, event) and per distinct (day, EUID) it holds,
/// in sorted order (two instances upserting the same keys take their row locks in one order).
/// Retention deletes both past the AppKey's maximum age.
extension Store {
    static let rollupSchema = """
        CREATE TABLE IF NOT EXISTS event_hours (
            app_key TEXT NOT NULL,
            hour_ms INTEGER NOT NULL,
            event TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (app_key, hour_ms, event)
        );
        CREATE TABLE IF NOT EXISTS user_days (
            app_key TEXT NOT NULL,
            day_ms INTEGER NOT NULL,
            euid TEXT NOT NULL,
            PRIMARY KEY (app_key, day_ms, euid)
        );
        CREATE INDEX IF NOT EXISTS user_days_user ON user_days(app_key, euid);
        """

    static let rollupReset = "DELETE FROM event_hours; DELETE FROM user_days;"

    /// Adds the indexed records `added` of AppKey `appKey` to the rollups.
    func rollUp(_ added: [IndexedRecord], appKey: String) throws(StoreError) {
        guard !appKey.isEmpty, !added.isEmpty else { return }
        var hours: [Rollup.HourKey: Int64] = [:]
        var days = Set<Rollup.DayKey>()
        for r in added {
            hours[Rollup.HourKey(hourMs: Rollup.floor(r.timeMs, Rollup.hourMs), event: r.event), default: 0] += 1
            if !r.euid.isEmpty { days.insert(Rollup.DayKey(dayMs: Rollup.floor(r.timeMs, Rollup.dayMs), euid: r.euid)) }
        }
        for (k, n) in hours.sorted(by: { ($0.key.hourMs, $0.key.event) < ($1.key.hourMs, $1.key.event) }) {
            try db.run(
                """
                INSERT INTO event_hours (app_key, hour_ms, event, n) VALUES (?, ?, ?, ?)
                ON CONFLICT (app_key, hour_ms, event) DO UPDATE SET n = event_hours.n + excluded.n
                """, [.text(appKey), .int(k.hourMs), .text(k.event), .int(n)])
        }
        for k in days.sorted(by: { ($0.dayMs, $0.euid) < ($1.dayMs, $1.euid) }) {
            try db.run(
                "INSERT INTO user_days (app_key, day_ms, euid) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [.text(appKey), .int(k.dayMs), .text(k.euid)])
        }
    }

    /// Deletes at most `RetentionLimits.batchRows` rollup rows of `appKey` before `cutoffMs`.
    func expireRollups(appKey: String, before cutoffMs: Int64) throws(StoreError) -> Int {
        let limit = SQLBind.int(Int64(RetentionLimits.batchRows))
        let hours = try db.run(
            """
            DELETE FROM event_hours WHERE app_key = ? AND hour_ms IN
                (SELECT hour_ms FROM event_hours WHERE app_key = ? AND hour_ms < ? ORDER BY hour_ms LIMIT ?)
            """, [.text(appKey), .text(appKey), .int(cutoffMs - Rollup.hourMs), limit])
        let days = try db.run(
            """
            DELETE FROM user_days WHERE app_key = ? AND day_ms IN
                (SELECT day_ms FROM user_days WHERE app_key = ? AND day_ms < ? ORDER BY day_ms LIMIT ?)
            """, [.text(appKey), .text(appKey), .int(cutoffMs - Rollup.dayMs), limit])
        return hours + days
    }
}

enum Rollup {
    static let hourMs: Int64 = 3_600_000
    static let dayMs: Int64 = 86_400_000

    struct HourKey: Hashable {
        var hourMs: Int64
        var event: String
    }

    struct DayKey: Hashable {
        var dayMs: Int64
        var euid: String
    }

    /// `t` rounded down to a multiple of `unit` (towards minus infinity).
    static func floor(_ t: Int64, _ unit: Int64) -> Int64 {
        let q = t / unit
        return (t % unit < 0 ? q - 1 : q) * unit
    }
}
