import PylonCore

/// `GET /v1/admin/dashboard`: the fleet at a glance, from indexed counts (batches by time,
/// deliveries by each funnel time) and the instances' heartbeats.
extension Backend {
    static func dayStart(_ ms: Int64) -> Int64 { ms - ms % 86_400_000 }

    /// `YYYY-MM-DD` of a day number since 1970-01-01 (civil from days, proleptic Gregorian).
    static func isoDay(_ days: Int64) -> String {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        let y = yoe + era * 400 + (m <= 2 ? 1 : 0)
        return "\(y)-\(String(m).leftPad(2))-\(String(d).leftPad(2))"
    }

    /// Push deliveries published, acknowledged by the app (delivered) and opened since `since`.
    func pushFunnel(since: Int64) throws(StoreError) -> (sent: Int64, delivered: Int64, opened: Int64) {
        (
            try store.consoleScalar("SELECT count(*) FROM push_deliveries WHERE published_at >= ?", [.int(since)]),
            try store.consoleScalar("SELECT count(*) FROM push_deliveries WHERE acked_at >= ?", [.int(since)]),
            try store.consoleScalar(
                """
                SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT) FROM batches
                WHERE stream = (SELECT id FROM streams WHERE name = 'push.opens') AND received_at >= ?
                """, [.int(since)])
        )
    }

    /// `GET /v1/admin/dashboard`. Events are counted from the batches' `accepted` by the time
    /// the backend received them (so with `--nats` too); ingest errors and refusals are this
    /// instance's since midnight UTC.
    func dashboard() throws(APIError) -> HTTPResponse {
        let now = System.wallClockMs()
        let day = Backend.dayStart(now)
        let minute = now / 60_000
        let firstMinute = (minute - 59) * 60_000
        let firstDay = day / 86_400_000 - 29
        return try storage { () throws(StoreError) -> HTTPResponse in
            let registered = try store.consoleScalar("SELECT count(*) FROM devices")
            let sum = "SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT) FROM batches WHERE received_at >= ?"
            let lastMinute = try store.consoleScalar(sum, [.int(now - 60_000)])
            let today = try store.consoleScalar(sum, [.int(day)])
            let push = try pushFunnel(since: day)
            var perMinute = [Int64](repeating: 0, count: 60)
            for r in try store.consoleQuery(
                "SELECT received_at / 60000, CAST(sum(accepted) AS BIGINT) FROM batches WHERE received_at >= ? GROUP BY 1",
                [.int(firstMinute)])
            {
                let i = Int((r[0].int ?? 0) - firstMinute / 60_000)
                if (0..<60).contains(i) { perMinute[i] += r[1].int ?? 0 }
            }
            var perDay = [Int64](repeating: 0, count: 30)
            var pushesPerDay = [Int64](repeating: 0, count: 30)
            for r in try store.consoleQuery(
                "SELECT received_at / 86400000, CAST(sum(accepted) AS BIGINT) FROM batches WHERE received_at >= ? GROUP BY 1",
                [.int(firstDay * 86_400_000)])
            {
                let i = Int((r[0].int ?? 0) - firstDay)
                if (0..<30).contains(i) { perDay[i] += r[1].int ?? 0 }
            }
            for r in try store.consoleQuery(
                "SELECT published_at / 86400000, count(*) FROM push_deliveries WHERE published_at >= ? GROUP BY 1",
                [.int(firstDay * 86_400_000)])
            {
                let i = Int((r[0].int ?? 0) - firstDay)
                if (0..<30).contains(i) { pushesPerDay[i] += r[1].int ?? 0 }
            }
            let instances = try store.instances(since: now - ConsoleLimits.forgetInstanceMs)
            let (refusedToday, errorsToday) = console.metrics.today(now: now)
            return HTTPResponse([
                // The broker does not tell the backend who is connected: null, not a guess.
                "devices": ["registered": .int(registered), "connected": .null],
                "events": ["perSecond": .double(Double(lastMinute) / 60), "today": .int(today)],
                "push": ["sentToday": .int(push.sent), "deliveredToday": .int(push.delivered), "openedToday": .int(push.opened)],
                "ingest": ["errorsToday": .int(Int64(errorsToday)), "refusedBatchesToday": .int(Int64(refusedToday))],
                "instances": .array(
                    instances.map {
                        [
                            "id": .string($0.id), "healthy": .bool(now - $0.lastSeenMs <= ConsoleLimits.instanceStaleMs),
                            "lastSeenMs": .int($0.lastSeenMs), "self": .bool($0.id == console.instanceId),
                        ]
                    }),
                "series": [
                    "lastHour": .array(
                        perMinute.enumerated().map { ["tMs": .int(firstMinute + Int64($0.offset) * 60_000), "events": .int($0.element)] }),
                    "last30Days": .array(
                        (0..<30).map {
                            [
                                "day": .string(Backend.isoDay(firstDay + Int64($0))), "events": .int(perDay[$0]),
                                "pushesSent": .int(pushesPerDay[$0]),
                            ]
                        }),
                ],
            ])
        }
    }
}
