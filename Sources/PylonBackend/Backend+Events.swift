import PylonCore

/// The console's data services that need the loop: the live tail and the periodic jobs
/// (erasures in bounded batches, retention, scheduled pushes). Created by `startConsoleData`.
package final class ConsoleData {
    let loop: Loop
    let tail: EventTail
    var jobTimer: Timer?
    /// Stream message deletes sent and not yet answered (`--nats` erasures).
    var streamDeletesInFlight = Set<Int64>()
    /// Job rounds since the start (retention runs every `RetentionLimits.everyRounds`).
    var rounds = 0
    /// A `max_age` update of the JetStream stream is waiting for its answer.
    var maxAgeUpdateInFlight = false
    /// The automation evaluator's caches and budgets (`Backend+Automation.swift`).
    let automation: AutomationState

    init(loop: Loop, store: Store, maxSSEClients: Int) {
        self.loop = loop
        automation = AutomationState(postgres: store.db.dialect == .postgres)
        tail = EventTail(loop: loop, store: store, maxClients: maxSSEClients)
    }
}

extension Backend {
    /// Starts the live tail and the periodic jobs on `loop` (`main`).
    package func startConsoleData(loop: Loop, maxSSEClients: Int) {
        let d = ConsoleData(loop: loop, store: store, maxSSEClients: maxSSEClients)
        consoleData = d
        d.jobTimer = Timer(loop: loop, unref: true) { [weak self] in self?.runJobs() }
        d.jobTimer?.start(after: DataLimits.jobIntervalMs, repeat: DataLimits.jobIntervalMs)
        console.metricSources.append { [weak d] m in
            guard let d else { return }
            m.single(
                "pylon_backend_sse_clients", .gauge, "Live tails (Server-Sent Events) open on this instance.", Double(d.tail.clientCount))
            m.single("pylon_backend_sse_events_total", .counter, "Events sent to live tails.", Double(d.tail.sent))
        }
    }

    /// Ends the live tails and stops the jobs (shutdown).
    package func stopConsoleData() {
        consoleData?.tail.stop()
        consoleData?.jobTimer?.close()
        consoleData?.jobTimer = nil
    }

    /// One round of the periodic jobs; each does a bounded amount of work.
    func runJobs() {
        for job in dataJobs { job(self) }
    }

    /// The console's data routes (`Router+Data.swift`), except the tail (`tail`).
    func data(_ request: HTTPRequest, _ r: DataRoute, _ principal: Principal) throws(APIError) -> HTTPResponse {
        switch r {
        case .events: return try searchEvents(request)
        case .eventsTail: throw .notFound(request.path)
        default: return try moreData(request, r, principal)
        }
    }

    /// `GET /v1/admin/events`: newest first, by cursor.
    func searchEvents(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        var e = Store.EventQuery()
        e.limit = try pageLimit(q, max: EventIndex.maxPage, default: EventIndex.defaultPage)
        e.appKey = try appKeyParam(q)
        if let s = nonEmpty(q["stream"]) {
            if let why = Router.invalidName(s, what: "stream") { throw .badRequest(.invalidRequest, why) }
            e.stream = s
            if e.appKey == nil, !EventIndex.appKey(ofStream: s).isEmpty { e.appKey = EventIndex.appKey(ofStream: s) }
        }
        e.event = nonEmpty(q["event"])
        e.euid = nonEmpty(q["euid"])
        e.fromMs = try intParam(q, "fromMs")
        e.toMs = try intParam(q, "toMs")
        let user = nonEmpty(q["user"])
        if e.appKey == nil, e.stream == nil, e.event != nil || e.euid != nil || user != nil {
            throw .badRequest(.invalidRequest, "filtering by event, euid or user needs appKey (or an ma.<appKey> stream)")
        }
        if let c = nonEmpty(q["cursor"]) {
            guard let parsed = EventCursor(parsing: c) else { throw .badRequest(.invalidRequest, "cursor is not one this API gave") }
            e.before = parsed
        }
        let rows = try storage { () throws(StoreError) -> [Store.EventRow] in
            if let user, let appKey = e.appKey {
                guard let euid = try store.maHolder(appKey, .userID, user) else { return [] }
                if let given = e.euid, given != euid { return [] }
                e.euid = euid
            }
            return try store.searchEvents(e, maxBytes: EventIndex.maxPageBytes)
        }
        let full = rows.count == e.limit || rows.reduce(0, { $0 + $1.data.utf8.count }) >= EventIndex.maxPageBytes
        return HTTPResponse([
            "items": .array(rows.map(EventIndex.json)),
            "nextCursor": full ? rows.last.map { .string(EventCursor(timeMs: $0.timeMs, id: $0.id).text) } ?? .null : .null,
        ])
    }

    // MARK: Parameters

    func nonEmpty(_ s: String?) -> String? {
        guard let s, !s.isEmpty else { return nil }
        return s
    }

    /// `limit` in 1...max (default `def`).
    func pageLimit(_ q: [String: String], max: Int = DataLimits.maxPage, default def: Int = DataLimits.defaultPage) throws(APIError)
        -> Int
    {
        guard let l = nonEmpty(q["limit"]) else { return def }
        guard let n = Int(l), (1...max).contains(n) else {
            throw .badRequest(.invalidRequest, "limit must be an integer in 1...\(max)")
        }
        return n
    }

    func intParam(_ q: [String: String], _ name: String) throws(APIError) -> Int64? {
        guard let v = nonEmpty(q[name]) else { return nil }
        guard let n = Int64(v) else { throw .badRequest(.invalidRequest, "\(name) must be an integer (milliseconds since the epoch)") }
        return n
    }

    func appKeyParam(_ q: [String: String]) throws(APIError) -> String? {
        guard let a = nonEmpty(q["appKey"]) else { return nil }
        if let why = Router.invalidAppKey(a) { throw .badRequest(.invalidRequest, why) }
        return a
    }
}

/// The event search's cursor: `<timeMs>.<id>` of the last event of the page (opaque to clients).
struct EventCursor: Equatable {
    var timeMs: Int64
    var id: Int64

    init(timeMs: Int64, id: Int64) {
        self.timeMs = timeMs
        self.id = id
    }

    init?(parsing s: String) {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let t = Int64(parts[0]), let i = Int64(parts[1]) else { return nil }
        self.init(timeMs: t, id: i)
    }

    var text: String { "\(timeMs).\(id)" }
}

/// Limits of the console's data API.
enum DataLimits {
    /// Lists: `?limit=` default and largest.
    static let defaultPage = 50
    static let maxPage = 500
    /// How often the periodic jobs run (erasure batches, retention, scheduled pushes).
    static let jobIntervalMs: UInt64 = 200
}
