import PylonCore
import PylonProtocol

/// Opt-outs, AppKey settings and retention (`Store+Privacy.swift`).
extension Backend {
    /// `GET /v1/admin/optouts?appKey=&cursor=&limit=`, newest first.
    func optOutList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        let limit = try pageLimit(q)
        let appKey = try appKeyParam(q)
        let before = try cursorInt(q) ?? Int64.max
        let rows = try storage { () throws(StoreError) in try store.optOuts(appKey: appKey, before: before, limit: limit) }
        return list(rows.map(\.json), next: rows.count == limit ? rows.last.map { String($0.timeMs) } : nil)
    }

    /// `GET /v1/admin/apps/{appKey}/settings`.
    func appSettings(appKey: String) throws(APIError) -> HTTPResponse {
        HTTPResponse(try storage { () throws(StoreError) in try store.appSettings(appKey) }.json)
    }

    /// `PUT /v1/admin/apps/{appKey}/settings {"eraseOnOptOut"?: bool, "maxAgeDays"?: N|null}`:
    /// the members given change, the others stay.
    func setAppSettings(_ request: HTTPRequest, appKey: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let o = body.objectValue else { throw .badRequest(.invalidRequest, "the body must be a JSON object") }
        var s = try storage { () throws(StoreError) in try store.appSettings(appKey) }
        if let v = o["eraseOnOptOut"] {
            guard let b = v.boolValue else { throw .badRequest(.invalidRequest, "eraseOnOptOut must be a boolean") }
            s.eraseOnOptOut = b
        }
        if let v = o["maxAgeDays"] { s.maxAgeDays = try maxAgeDays(v) }
        try storage { () throws(StoreError) in try store.setAppSettings(appKey, s) }
        recordChange(principal, "settings", target: "app/" + appKey, detail: ["settings": s.json])
        return HTTPResponse(s.json)
    }

    /// `GET /v1/admin/retention`.
    func retention() throws(APIError) -> HTTPResponse {
        let r = try storage { () throws(StoreError) in try store.retention() }
        var apps: JSONObject = [:]
        for (a, d) in r.apps { apps[a] = ["maxAgeDays": .int(d)] }
        var streams: JSONObject = [:]
        for (s, d) in r.streams { streams[s] = ["maxAgeDays": .int(d)] }
        var out: JSONObject = ["apps": .object(apps), "streams": .object(streams)]
        if let js = jetstream {
            out["natsMaxAgeS"] = .int(Int64(js.maxAgeS))
            let days = try storage { () throws(StoreError) in try store.jetStreamMaxAgeDays(js.settings.stream.name) }
            out["natsMaxAgeDays"] = days.map(JSON.int) ?? .null
        }
        return HTTPResponse(.object(out))
    }

    /// `PUT /v1/admin/retention {"apps": {appKey: {"maxAgeDays": N|null}}, "streams": {...}}`:
    /// the AppKeys and streams named change (null removes the rule).
    func setRetention(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let o = body.objectValue else { throw .badRequest(.invalidRequest, "the body must be a JSON object") }
        var apps: [(String, Int64?)] = []
        var streams: [(String, Int64?)] = []
        for (k, v) in o["apps"]?.objectValue ?? [:] {
            if let why = Router.invalidAppKey(k) { throw .badRequest(.invalidRequest, why) }
            apps.append((k, try maxAgeDays(v["maxAgeDays"] ?? .null)))
        }
        for (k, v) in o["streams"]?.objectValue ?? [:] {
            if let why = Router.invalidName(k, what: "stream") { throw .badRequest(.invalidRequest, why) }
            streams.append((k, try maxAgeDays(v["maxAgeDays"] ?? .null)))
        }
        guard apps.count + streams.count <= RetentionLimits.maxRules else {
            throw .badRequest(.invalidRequest, "at most \(RetentionLimits.maxRules) rules")
        }
        var natsDays: Int64?? = nil
        if let v = o["natsMaxAgeDays"] {
            guard jetstream != nil else { throw .badRequest(.invalidRequest, "natsMaxAgeDays needs a backend started with --nats") }
            natsDays = .some(try maxAgeDays(v))
        }
        try storage { () throws(StoreError) in
            try store.transaction { () throws(StoreError) in
                for (a, d) in apps { try store.setAppRetention(a, days: d) }
                for (s, d) in streams { try store.setStreamRetention(s, days: d) }
                if let js = jetstream, let d = natsDays { try store.setJetStreamMaxAgeDays(js.settings.stream.name, d) }
            }
        }
        if natsDays != nil { reconcileStreamMaxAge() }
        recordChange(principal, "retention", target: "retention", detail: ["body": body])
        return try retention()
    }

    private func maxAgeDays(_ v: JSON) throws(APIError) -> Int64? {
        if v == .null { return nil }
        guard let n = v.intValue, (1...RetentionLimits.maxDays).contains(n) else {
            throw .badRequest(.invalidRequest, "maxAgeDays must be null or an integer in 1...\(RetentionLimits.maxDays)")
        }
        return n
    }

    /// Sets the JetStream stream's `max_age` to the rule in the database (or `--nats-max-age-s`
    /// without one) when this instance last knew it otherwise; every instance converges on it.
    func reconcileStreamMaxAge() {
        guard let js = jetstream, let d = consoleData, !d.maxAgeUpdateInFlight else { return }
        let days: Int64?
        do throws(StoreError) { days = try store.jetStreamMaxAgeDays(js.settings.stream.name) } catch { return }
        let want = days.map { Int($0 * 86_400) } ?? js.settings.stream.maxAgeS
        guard want != js.maxAgeS else { return }
        d.maxAgeUpdateInFlight = js.updateMaxAge(seconds: want) { [weak self] ok in
            self?.consoleData?.maxAgeUpdateInFlight = false
            self?.log.info("stream max_age", ["stream": js.settings.stream.name, "seconds": want, "confirmed": ok])
        }
    }

    /// The periodic retention job: for each rule, at most one batch of expired events per round,
    /// `RetentionLimits.batchesPerRound` batches in all.
    func runRetention() {
        guard let d = consoleData else { return }
        d.rounds += 1
        guard d.rounds % RetentionLimits.everyRounds == 0 else { return }
        reconcileStreamMaxAge()
        do throws(StoreError) {
            let r = try store.retention()
            let now = System.wallClockMs()
            var batches = 0
            for (a, days) in r.apps where batches < RetentionLimits.batchesPerRound {
                if try store.expireEvents(appKey: a, before: now - days * 86_400_000) > 0 { batches += 1 }
                if try store.expireRollups(appKey: a, before: now - days * 86_400_000) > 0 { batches += 1 }
            }
            for (s, days) in r.streams where batches < RetentionLimits.batchesPerRound {
                if try store.expireEvents(stream: s, before: now - days * 86_400_000) > 0 { batches += 1 }
            }
            if batches > 0 { log.debug("retention", ["batches": batches]) }
        } catch {
            log.warn("retention job failed", ["error": error.description])
        }
    }
}
