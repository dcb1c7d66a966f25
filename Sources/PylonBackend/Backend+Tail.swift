import PylonCore

/// The live tail (`GET /v1/admin/events/tail`, Server-Sent Events).
///
/// One poller per backend instance reads the event index (`Store+Events.swift`) by id every
/// `TailLimits.pollMs` while at least one client is connected, and hands each new event to the
/// clients whose filter it matches. Every instance indexes what it ingests, in every mode (the
/// database, or `--nats` once JetStream acknowledged), so on a shared PostgreSQL database each
/// instance's tail sees the events the others ingested. A poll is one indexed read of at most
/// `TailLimits.pollRows` rows.
///
/// Ids are given out before their transaction commits, so on PostgreSQL a smaller id can become
/// visible after a larger one: ids skipped by a poll are kept as gaps (at most
/// `TailLimits.maxGaps`, each for `TailLimits.gapWaitMs`) and read again, so an event committed
/// late still reaches the tail.
///
/// Clients are bounded (`--max-sse-clients`: 503 beyond it) and so is each one's unwritten
/// output (`TailLimits.maxBufferedBytes`: a client that falls behind is disconnected; its
/// browser reconnects). A comment line every `TailLimits.heartbeatMs` keeps proxies from
/// closing an idle stream.
final class EventTail {
    struct Filter: Equatable {
        var appKey: String?
        var event: String?
        var stream: String?

        func matches(_ r: Store.EventRow) -> Bool {
            (appKey == nil || appKey == r.appKey) && (event == nil || event == r.event) && (stream == nil || stream == r.stream)
        }
    }

    private final class Client {
        let stream: ResponseStream
        let filter: Filter
        init(_ stream: ResponseStream, _ filter: Filter) {
            self.stream = stream
            self.filter = filter
        }
    }

    private let loop: Loop
    private let store: Store
    let maxClients: Int
    private var clients: [ObjectIdentifier: Client] = [:]
    private var timer: Timer?
    /// The largest id read so far (nil until the first client: the tail shows new events only).
    private var cursor: Int64?
    /// Ids below `cursor` not seen yet, with when they were first missed.
    private var gaps: [Int64: UInt64] = [:]
    private var lastHeartbeat: UInt64 = 0
    private let log = Log("tail")
    /// Events sent to clients, since the start.
    private(set) var sent = 0

    init(loop: Loop, store: Store, maxClients: Int) {
        self.loop = loop
        self.store = store
        self.maxClients = maxClients
    }

    var clientCount: Int { clients.count }

    /// A new client's stream, or nil when `maxClients` are connected.
    func add(_ filter: Filter) throws(StoreError) -> ResponseStream? {
        guard clients.count < maxClients else { return nil }
        if cursor == nil {
            cursor = try store.lastEventID()
            gaps = [:]
        }
        let s = ResponseStream(contentType: "text/event-stream", maxBufferedBytes: TailLimits.maxBufferedBytes)
        let id = ObjectIdentifier(s)
        clients[id] = Client(s, filter)
        s.onClose = { [weak self] in self?.remove(id) }
        s.send(Array(": pylon live tail\nretry: 1000\n\n".utf8))
        if timer == nil {
            timer = Timer(loop: loop) { [weak self] in self?.poll() }
            lastHeartbeat = loop.nowMs
            timer?.start(after: TailLimits.pollMs, repeat: TailLimits.pollMs)
        }
        return s
    }

    private func remove(_ id: ObjectIdentifier) {
        clients[id] = nil
        if clients.isEmpty {
            timer?.close()
            timer = nil
            cursor = nil
            gaps = [:]
        }
    }

    /// Ends every stream (shutdown).
    func stop() {
        for c in Array(clients.values) { c.stream.finish() }
        clients = [:]
        timer?.close()
        timer = nil
    }

    private func poll() {
        guard let from = cursor else { return }
        let now = loop.nowMs
        var rows: [Store.EventRow]
        do throws(StoreError) {
            rows = try store.eventsAfter(from, limit: TailLimits.pollRows)
            let waiting = gaps.keys.sorted()
            if !waiting.isEmpty {
                let found = try store.events(ids: Array(waiting.prefix(TailLimits.maxGapReads)))
                for r in found { gaps[r.id] = nil }
                rows = found + rows
            }
        } catch {
            log.warn("tail poll failed", ["error": error.description])
            return
        }
        var top = from
        for r in rows where r.id > from {
            var missing = top + 1
            while missing < r.id, gaps.count < TailLimits.maxGaps {
                gaps[missing] = now
                missing += 1
            }
            top = max(top, r.id)
        }
        cursor = top
        gaps = gaps.filter { now &- $0.value < TailLimits.gapWaitMs }
        if !rows.isEmpty { deliver(rows) }
        if now &- lastHeartbeat >= TailLimits.heartbeatMs {
            lastHeartbeat = now
            for c in Array(clients.values) { c.stream.send(Array(": heartbeat\n\n".utf8)) }
        }
    }

    private func deliver(_ rows: [Store.EventRow]) {
        for r in rows {
            var frame: [UInt8]?
            for c in Array(clients.values) where c.filter.matches(r) {
                if frame == nil { frame = Array("event: record\ndata: \(EventIndex.json(r).serialized)\n\n".utf8) }
                if c.stream.send(frame!) { sent += 1 }
            }
        }
    }
}

/// The live tail's limits (docs/FLEET.md, "Live tail").
enum TailLimits {
    /// Default for `--max-sse-clients`: live tails open at once per instance (503 beyond).
    static let defaultMaxClients = 32
    /// How often the index is read while a client is connected.
    static let pollMs: UInt64 = 250
    /// Rows read per poll at most (the rest follow at the next poll).
    static let pollRows = 500
    /// Unwritten bytes one client may fall behind by before it is disconnected.
    static let maxBufferedBytes = 1 << 20
    /// A comment line this often keeps an idle stream open through proxies.
    static let heartbeatMs: UInt64 = 15_000
    /// Ids skipped by a poll are read again for this long (a transaction committing late).
    static let gapWaitMs: UInt64 = 5_000
    static let maxGaps = 1024
    /// Gap ids read per poll at most.
    static let maxGapReads = 64
}

extension Store {
    /// The events with these ids (those that exist), in id order.
    func events(ids: [Int64]) throws(StoreError) -> [EventRow] {
        guard !ids.isEmpty else { return [] }
        // A fixed number of parameters (the last id repeated), so one prepared statement serves.
        let n = TailLimits.maxGapReads
        let padded = (0..<n).map { i in SQLBind.int(ids[min(i, ids.count - 1)]) }
        let marks = Array(repeating: "?", count: n).joined(separator: ", ")
        return try db.query("SELECT " + Store.eventColumns + " WHERE e.id IN (\(marks)) ORDER BY e.id", padded).map(EventIndex.row)
    }
}

extension Backend {
    /// `GET /v1/admin/events/tail?appKey=&event=&stream=`: a Server-Sent Events stream of
    /// `event: record` frames, one per indexed record matching the filter.
    func tail(_ request: HTTPRequest) throws(APIError) -> Disposition {
        guard let tail = consoleData?.tail else {
            throw APIError(status: 503, code: .serverBusy, message: "the live tail is not running")
        }
        let q = request.query
        var f = EventTail.Filter()
        if let a = q["appKey"], !a.isEmpty {
            if let why = Router.invalidAppKey(a) { throw .badRequest(.invalidRequest, why) }
            f.appKey = a
        }
        if let e = q["event"], !e.isEmpty { f.event = e }
        if let s = q["stream"], !s.isEmpty {
            if let why = Router.invalidName(s, what: "stream") { throw .badRequest(.invalidRequest, why) }
            f.stream = s
        }
        guard let s = try storage({ () throws(StoreError) in try tail.add(f) }) else {
            throw APIError(
                status: 503, code: .serverBusy, message: "\(tail.maxClients) live tails are open (--max-sse-clients); retry later",
                retryAfter: 5)
        }
        return .stream(s)
    }
}
