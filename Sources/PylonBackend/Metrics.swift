import PylonCore

/// Prometheus text (format 0.0.4) built family by family over PylonCore's `MetricsText` (which
/// escapes label values and writes each family's `# HELP` and `# TYPE` once). Every label the
/// backend uses has a bounded set of values (route classes, status classes, states), never a
/// raw path or id.
package struct MetricsText {
    private var core = PylonCore.MetricsText()
    var text: String { core.text }

    package enum Kind: String { case counter, gauge }

    package mutating func family(_ name: String, _ kind: Kind, _ help: String, _ samples: [([(String, String)], Double)]) {
        for (labels, v) in samples { core.add(name, kind.rawValue, help, labels, v) }
    }

    package mutating func single(_ name: String, _ kind: Kind, _ help: String, _ value: Double) {
        family(name, kind, help, [([], value)])
    }
}

/// The request and ingest counters of this instance since it started.
struct MetricsCounters {
    /// The route classes of `pylon_backend_requests_total` (bounded: no raw path is a label).
    static let routes = ["ingest", "device", "admin", "inspect", "console", "session", "metrics", "other"]
    static let codes = ["2xx", "4xx", "5xx"]
    /// Requests by route class and status class, indexed `[route][code]`.
    var requests = Array(repeating: [0, 0, 0], count: routes.count)
    var ingestBatches = 0
    var ingestRecords = 0
    var ingestRefused = 0
    var ingestFailed = 0
    var loginFailures = 0
    /// Refused (4xx) and failed (5xx) ingest requests of the current UTC day (the dashboard's).
    var day: Int64 = 0
    var refusedToday = 0
    var failedToday = 0

    /// Refused and failed ingest requests of the UTC day of `now`.
    func today(now: Int64) -> (refused: Int, failed: Int) {
        day == now / 86_400_000 ? (refusedToday, failedToday) : (0, 0)
    }

    /// The route class of a request path.
    static func route(_ path: Substring) -> Int {
        func has(_ p: String) -> Bool { path.hasPrefix(p) }
        let name: String
        if has("/v1/batches/") {
            name = "ingest"
        } else if has("/v1/devices/") || has("/v1/ma/") || has("/v1/push/") || has("/v1/gtm/") {
            name = "device"
        } else if has("/v1/admin/") {
            name = "admin"
        } else if has("/v1/inspect/") {
            name = "inspect"
        } else if path == "/v1/session" || has("/v1/session/") {
            name = "session"
        } else if path == "/metrics" {
            name = "metrics"
        } else if has("/v1/") || path == "/v1" || path == "/healthz" {
            name = "other"
        } else {
            name = "console"
        }
        return routes.firstIndex(of: name)!
    }

    /// Counts one answered request; an ingest answer's `accepted` counts its records.
    mutating func count(path: Substring, _ response: HTTPResponse, now: Int64) {
        let r = MetricsCounters.route(path)
        let c = response.status >= 500 ? 2 : response.status >= 400 ? 1 : 0
        requests[r][c] += 1
        guard MetricsCounters.routes[r] == "ingest" else { return }
        let today = now / 86_400_000
        if today != day {
            day = today
            refusedToday = 0
            failedToday = 0
        }
        switch c {
        case 0:
            ingestBatches += 1
            if case .int(let n)? = response.body["accepted"] { ingestRecords += Int(n) }
        case 1:
            ingestRefused += 1
            refusedToday += 1
        default:
            ingestFailed += 1
            failedToday += 1
        }
    }
}

extension Backend {
    /// `GET /metrics`: this instance's counters and the database's gauges, Prometheus text.
    func metricsResponse() throws(APIError) -> HTTPResponse {
        var m = MetricsText()
        let c = console.metrics
        var samples: [([(String, String)], Double)] = []
        for (i, route) in MetricsCounters.routes.enumerated() {
            for (j, code) in MetricsCounters.codes.enumerated() {
                samples.append(([("route", route), ("code", code)], Double(c.requests[i][j])))
            }
        }
        m.family("pylon_backend_requests_total", .counter, "HTTP requests answered, by route class and status class.", samples)
        m.family(
            "pylon_backend_ingest_batches_total", .counter, "Ingest requests by outcome (accepted 2xx, refused 4xx, failed 5xx).",
            [
                ([("outcome", "accepted")], Double(c.ingestBatches)), ([("outcome", "refused")], Double(c.ingestRefused)),
                ([("outcome", "failed")], Double(c.ingestFailed)),
            ])
        m.single("pylon_backend_ingest_records_total", .counter, "Records accepted (new, not duplicates).", Double(c.ingestRecords))
        m.single("pylon_backend_login_failures_total", .counter, "Failed operator logins.", Double(c.loginFailures))
        let day = Backend.dayStart(System.wallClockMs())
        let push = try storage { () throws(StoreError) in try pushFunnel(since: day) }
        m.family(
            "pylon_backend_push_today", .gauge, "Push deliveries since 00:00 UTC by funnel stage (all instances).",
            [
                ([("stage", "sent")], Double(push.sent)), ([("stage", "delivered")], Double(push.delivered)),
                ([("stage", "opened")], Double(push.opened)),
            ])
        m.single(
            "pylon_backend_broker_connected", .gauge, "1 while connected to the MQTT broker (0 without --mqtt).",
            mqtt?.state == .connected ? 1 : 0)
        if let js = jetstream {
            let k = js.counters
            m.single(
                "pylon_backend_stream_ready", .gauge, "1 while the JetStream ingest stream is connected and ready.", js.isReady ? 1 : 0)
            m.single(
                "pylon_backend_stream_in_flight", .gauge, "Publishes waiting for their JetStream acknowledgement.", Double(js.inFlight))
            m.family(
                "pylon_backend_stream_publishes_total", .counter, "JetStream publishes by outcome.",
                [
                    ([("outcome", "acked")], Double(k.acked)), ([("outcome", "duplicate")], Double(k.duplicates)),
                    ([("outcome", "failed")], Double(k.failed)), ([("outcome", "timed_out")], Double(k.timedOut)),
                    ([("outcome", "unavailable")], Double(k.unavailable)), ([("outcome", "busy")], Double(k.busy)),
                ])
        }
        m.single("pylon_backend_db_connections", .gauge, "Open database connections of this instance (one per instance).", 1)
        m.single(
            "pylon_backend_db_conflict_retries_total", .counter, "Request transactions run again after a conflict (PostgreSQL).",
            Double(store.conflictRetries))
        m.single("pylon_backend_output_bytes", .gauge, "Response bytes waiting for slow clients.", Double(outputBudget?.used ?? 0))
        m.single("pylon_backend_password_jobs", .gauge, "Password hashes running on the thread pool.", Double(console.passwordJobs))
        for source in console.metricSources { source(&m) }
        return HTTPResponse(contentType: "text/plain; version=0.0.4; charset=utf-8", bytes: Array(m.text.utf8))
    }
}
