import PylonCore
import PylonStore

/// Analytics of one AppKey, computed by the database
/// (`GET /v1/admin/analytics/{appKey}/{counts|top-events|uniques|funnel}`) over `[fromMs, toMs)`
/// (default: the last 30 days; a funnel's range is cut to its last 7). Counts and top events sum the hourly rollup and unique users
/// count the daily one (`Store+Rollups.swift`), so their cost depends on the hours and days in
/// the range, not on the events: the range is taken in whole hours (days for uniques) and may
/// span `AnalyticsLimits.maxSpanDays`. The funnel reads the event index (the
/// `(app_key, event, time_ms)` and `(app_key, euid, time_ms)` ranges), so its range is
/// shorter: `AnalyticsLimits.maxFunnelSpanDays`.
extension Backend {
    func analytics(_ request: HTTPRequest, appKey: String, _ kind: DataRoute.AnalyticsKind) throws(APIError) -> HTTPResponse {
        let q = request.query
        let now = System.wallClockMs()
        let to = try intParam(q, "toMs") ?? now
        var from = try intParam(q, "fromMs") ?? to - 30 * Rollup.dayMs
        guard from < to else { throw .badRequest(.invalidRequest, "fromMs must be before toMs") }
        // A funnel reads events: its range is cut to its last `maxFunnelSpanDays` (answered).
        if kind == .funnel { from = max(from, to - AnalyticsLimits.maxFunnelSpanDays * Rollup.dayMs) }
        let hourly = q["bucket"] == "hour"
        if let b = nonEmpty(q["bucket"]), b != "hour", b != "day" { throw .badRequest(.invalidRequest, "bucket must be hour or day") }
        let maxDays = kind == .funnel ? AnalyticsLimits.maxFunnelSpanDays : AnalyticsLimits.maxSpanDays
        guard to - from <= maxDays * Rollup.dayMs else {
            throw .badRequest(.invalidRequest, "the range may span at most \(maxDays) days")
        }
        let app = SQLBind.text(appKey)
        // Whole hours: the hour holding `from` up to the hour holding `to - 1`.
        let hours: [SQLBind] = [app, .int(Rollup.floor(from, Rollup.hourMs)), .int(to)]
        switch kind {
        case .counts:
            let width = hourly ? Rollup.hourMs : Rollup.dayMs
            let rows = try analyticsQuery(
                """
                SELECT (hour_ms / ?) * ?, sum(n) FROM event_hours WHERE app_key = ? AND hour_ms >= ? AND hour_ms < ?
                GROUP BY 1 ORDER BY 1
                """, [.int(width), .int(width)] + hours)
            return items(rows.map { ["tMs": .int($0[0].int ?? 0), "events": .int($0[1].int ?? 0)] })
        case .topEvents:
            let limit = try pageLimit(q, max: AnalyticsLimits.maxTopEvents, default: 10)
            let rows = try analyticsQuery(
                """
                SELECT event, sum(n) FROM event_hours WHERE app_key = ? AND hour_ms >= ? AND hour_ms < ?
                GROUP BY event ORDER BY 2 DESC, 1 LIMIT ?
                """, hours + [.int(Int64(limit))])
            return items(rows.map { ["event": .string($0[0].text ?? ""), "count": .int($0[1].int ?? 0)] })
        case .uniques:
            let rows = try analyticsQuery(
                """
                SELECT day_ms, count(*) FROM user_days WHERE app_key = ? AND day_ms >= ? AND day_ms < ?
                GROUP BY day_ms ORDER BY day_ms
                """, [app, .int(Rollup.floor(from, Rollup.dayMs)), .int(to)])
            return items(rows.map { ["day": .string(AnalyticsLimits.day($0[0].int ?? 0)), "users": .int($0[1].int ?? 0)] })
        case .funnel:
            guard let a = nonEmpty(q["a"]), let b = nonEmpty(q["b"]) else { throw .badRequest(.invalidRequest, "a and b are required") }
            let days = try intParam(q, "days") ?? 7
            guard (1...AnalyticsLimits.maxFunnelDays).contains(days) else {
                throw .badRequest(.invalidRequest, "days must be 1...\(AnalyticsLimits.maxFunnelDays)")
            }
            // Each user's first `a` in the range, then whether a `b` follows within `days`.
            let firsts = """
                SELECT euid, min(time_ms) AS t FROM events
                WHERE app_key = ? AND event = ? AND time_ms >= ? AND time_ms < ? AND euid <> '' GROUP BY euid
                """
            let rows = try analyticsQuery(
                """
                SELECT count(*), coalesce(sum(CASE WHEN EXISTS (SELECT 1 FROM events x WHERE x.app_key = ? AND x.euid = f.euid
                    AND x.time_ms > f.t AND x.time_ms <= f.t + ? AND x.event = ?) THEN 1 ELSE 0 END), 0)
                FROM (\(firsts)) f
                """, [app, .int(days * Rollup.dayMs), .text(b), app, .text(a), .int(from), .int(to)])
            let n = rows.first?[0].int ?? 0
            let m = rows.first?[1].int ?? 0
            return HTTPResponse([
                "a": .int(n), "ab": .int(m), "rate": n > 0 ? .double(Double(m) / Double(n)) : .null, "days": .int(days),
                "fromMs": .int(from), "toMs": .int(to),
            ])
        }
    }

    private func analyticsQuery(_ sql: String, _ args: [SQLBind]) throws(APIError) -> [[SQLValue]] {
        try storage { () throws(StoreError) in try store.consoleRows(sql, args) }
    }

    private func items(_ list: [JSON]) -> HTTPResponse { HTTPResponse(["items": .array(list)]) }
}

extension Store {
    /// A read of the console's data API (statements written in this module, bounded by their
    /// ranges and limits).
    func consoleRows(_ sql: String, _ args: [SQLBind]) throws(StoreError) -> [[SQLValue]] { try db.query(sql, args) }
}

enum AnalyticsLimits {
    /// The widest range of counts, top events and uniques (rollup rows: hours × event names).
    static let maxSpanDays: Int64 = 400
    /// The widest range of a funnel: a longer one is cut to its last this many days (it reads
    /// the users' first `a` from the event index: 96 ms over 7 days of 1,000,000 events on
    /// PostgreSQL, 410 ms over 30 days; docs/BENCHMARKS.md).
    static let maxFunnelSpanDays: Int64 = 7
    static let maxTopEvents = 100
    static let maxFunnelDays: Int64 = 90

    /// `YYYY-MM-DD` (UTC) of a time in milliseconds.
    static func day(_ ms: Int64) -> String {
        Backend.isoDay(ms >= 0 ? ms / 86_400_000 : (ms - 86_399_999) / 86_400_000)
    }
}
