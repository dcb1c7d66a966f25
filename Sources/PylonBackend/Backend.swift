import PylonCore
import PylonMQTT
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The application: turns each request into a `Disposition`. Owns the store, the injected
/// fault state and the request counters. Runs on the loop thread only.
package final class Backend {
    let store: Store
    let maxBody: Int
    private(set) var faults = FaultState()
    private(set) var stats = Stats()
    /// Container fetches by id and outcome (`published`, `notModified`, `draft`, `denied`).
    var gtmFetches: [String: [String: Int]] = [:]
    let log = Log("backend")
    /// The broker connection push sends are published through (`--mqtt`); nil without one.
    package var mqtt: MQTTClient?
    /// The secrets requests are authenticated with (`Auth.swift`).
    package var credentials = Credentials()
    /// `/v1/faults` exists only with `--enable-fault-injection` (tests); otherwise it is 404.
    package var faultsEnabled = false
    /// The broker runs the dynamic-security plugin and this backend is its admin (`--mqtt-dynsec`).
    package var dynsec = false
    /// The broker is a nats-server cluster with JWT auth (`--mqtt-nats-auth`): registration
    /// mints each device's broker credential (`NATSAuth.swift`).
    package var natsAuth: NATSAuth?
    /// The broker runs the `pylon_auth` plugin (`--mqtt-auth-key-file`): registration signs each
    /// device's broker password (`MQTTAuth.swift`).
    package var mqttAuth: MQTTAuth?
    /// The server's output budget, shown in `/v1/inspect/stats` (set by `main`).
    package var outputBudget: OutputBudget?
    /// Dynsec commands per device id not yet confirmed by the broker (`Backend+Broker.swift`).
    var pendingDynsec: [String: [UInt8]] = [:]
    /// NATS mode (`--nats`): batches go to the JetStream ingest stream (`Backend+Ingest.swift`).
    package var jetstream: JetStreamPublisher?
    /// Sessions, accounts, the console's files and counters (`Backend+Session.swift`).
    package var console = ConsoleState()
    /// The live tail and the data jobs (`Backend+Events.swift`); nil until `startConsoleData`.
    package var consoleData: ConsoleData?
    /// Devices known to have declared an AppKey (`Backend+Devices.swift`; bounded).
    var deviceApps: Set<DeviceApp> = []
    /// Where ingest waits so sends do not (`IngestLane.swift`); nil: ingest runs as it is read.
    var lane: IngestLane?
    /// Push delivery marks waiting for the end of a broker read (`Backend+Push.swift`).
    var marks = DeliveryMarks()

    /// Runs ingest work through the lane once the loop is known (`main`).
    package func startIngestLane(loop: Loop, maxGroup: Int = IngestLane.defaultMaxGroup, sliceNs: UInt64 = IngestLane.defaultSliceNs) {
        lane = IngestLane(loop: loop, maxGroup: maxGroup, sliceNs: sliceNs) { [unowned self] group in self.commit(group) }
    }

    /// Group commit (`IngestLane`): the writes of a slice in one transaction, then each job
    /// told; if the group fails, each job's writes run alone (and only a failing one is told
    /// its error).
    func commit(_ group: [IngestLane.Writes]) {
        if group.count > 1 {
            do throws(StoreError) {
                try store.transaction(.readCommitted) { () throws(StoreError) in
                    for w in group { try w.write() }
                }
                for w in group { w.done(nil) }
                return
            } catch {
                log.info("group commit failed; committing its batches one by one", ["batches": group.count, "error": error.description])
            }
        }
        for w in group {
            do throws(StoreError) {
                try store.transaction(.readCommitted) { () throws(StoreError) in try w.write() }
                w.done(nil)
            } catch {
                w.done(error)
            }
        }
    }

    package init(store: Store, maxBody: Int) {
        self.store = store
        self.maxBody = maxBody
    }

    /// Counts the request, routes it, authenticates the caller (`Auth.swift`), applies injected
    /// faults unless the path is exempt, then runs the handler. A request refused or answered by
    /// a fault never reaches its handler, so it stores nothing. Every answer is then counted,
    /// given the console's headers and audited (`Backend+Console.swift`).
    package func handle(_ request: HTTPRequest) -> Disposition {
        console.current = nil
        console.audited = false
        return finish(request, dispatch(request))
    }

    private func dispatch(_ request: HTTPRequest) -> Disposition {
        let path = request.path
        stats.count(path: path)
        // A refused credential is answered at once (it consumes no injected fault); routing
        // errors (404, 405, 400) are subject to faults like any request.
        let admitted: Result<(Endpoint, Principal), APIError>
        do throws(APIError) {
            admitted = .success(try admit(request))
        } catch {
            if error.status == 401 || error.status == 403 {
                stats.refused += 1
                log.debug("refused", ["method": request.method, "path": path, "status": error.status])
                return .respond(HTTPResponse(error), delayMs: 0)
            }
            admitted = .failure(error)
        }
        var delay: UInt64 = 0
        if !Router.isFaultExempt(path) {
            delay = UInt64(faults.latencyMs)
            switch faults.next() {
            case .pass: break
            case .drop:
                stats.faultsInjected += 1
                log.info("fault: dropping connection", ["method": request.method, "path": path])
                return .drop
            case .fail(let status, let retryAfter):
                stats.faultsInjected += 1
                log.info("fault: failing request", ["method": request.method, "path": path, "status": status])
                let e = APIError(status: status, code: .injectedFault, message: "injected fault", retryAfter: retryAfter)
                return .respond(HTTPResponse(e), delayMs: delay)
            }
        }
        let response: HTTPResponse
        do throws(APIError) {
            let (endpoint, principal) = try admitted.get()
            console.current = (endpoint, principal)
            if case .console(let r) = endpoint, let d = try consoleLater(request, r, principal) { return d }
            if case .ingest(let stream) = endpoint {
                guard let lane, delay == 0 else { return try ingestNow(request, stream: stream, principal, into: nil, delay: delay) }
                let answer = DeferredAnswer()
                lane.enqueue { [unowned self] () -> IngestLane.Writes? in
                    do throws(APIError) {
                        if jetstream == nil { return try ingestWrites(request, stream: stream, principal, answer) }
                        if case .respond(let r, _) = try ingestNow(request, stream: stream, principal, into: answer, delay: 0) {
                            answer.answer(r)
                        }
                    } catch {
                        answer.answer(HTTPResponse(error))
                    }
                    return nil
                }
                return .later(answer)
            }
            if case .data(.eventsTail) = endpoint { return try tail(request) }
            response = try route(request, endpoint, principal)
        } catch {
            response = HTTPResponse(error)
        }
        log.debug("request", ["method": request.method, "target": request.target, "status": response.status])
        return .respond(response, delayMs: delay)
    }

    /// The endpoint and the authenticated caller, or the error to answer: 404/405/400 from
    /// routing, 404 for the fault API unless `faultsEnabled`, 401/403 from `authorize`.
    private func admit(_ request: HTTPRequest) throws(APIError) -> (Endpoint, Principal) {
        switch Router.match(method: request.method, path: request.path) {
        case .notFound: throw .notFound(request.path)
        case .methodNotAllowed(let allowed): throw .methodNotAllowed(request.method, allowed: allowed)
        case .badParameter(let why): throw .badRequest(.invalidRequest, why)
        case .endpoint(let e):
            if !faultsEnabled, e == .getFaults || e == .setFaults || e == .clearFaults { throw .notFound(request.path) }
            return (e, try authorize(request, e.access))
        }
    }

    private func route(_ request: HTTPRequest, _ e: Endpoint, _ principal: Principal) throws(APIError) -> HTTPResponse {
        switch e {
        case .health: return HTTPResponse(["ok": true])
        case .deviceRegister: return try registerDevice(request, principal)
        case .deviceReenrol(let installId): return try approveReenrolment(installId: installId, principal)
        case .enrolmentKeys(let id): return try enrolmentKeys(request, id: id, principal)
        case .ingest(let stream): return try ingest(request, stream: stream, principal)
        case .inspectStream(let stream): return try inspect(stream: stream)
        case .inspectRecords(let stream): return try records(request, stream: stream)
        case .stats: return try statsResponse()
        case .reset: return try reset()
        case .getFaults: return HTTPResponse(faults.json)
        case .setFaults:
            try faults.merge(try jsonBody(request))
            lane?.held = faults.holdIngest
            log.info("faults set", ["state": faults.json.serialized])
            return HTTPResponse(faults.json)
        case .clearFaults:
            faults = FaultState()
            lane?.held = false
            return HTTPResponse(faults.json)
        case .maCall(let appKey, let call):
            try noteDeviceApp(appKey: appKey, principal)
            return try maCall(request, appKey: appKey, call)
        case .maGetApp(let appKey): return try maApp(appKey: appKey)
        case .maSetApp(let appKey): return try setMAApp(request, appKey: appKey)
        case .maGetMetadata(let appKey): return try maMetadata(appKey: appKey)
        case .maSetMetadata(let appKey): return try setMAMetadata(request, appKey: appKey)
        case .maFindUser(let appKey): return try maFindUser(request, appKey: appKey)
        case .maInspectUser(let appKey, let euid): return try maInspectUser(appKey: appKey, euid: euid)
        case .pushCall(let call): return try pushCall(request, call, principal)
        case .pushSend: return try pushSendRecorded(request, principal)
        case .pushInspect(let what): return try pushInspect(request, what)
        case .gtmPublished(let id): return try gtmPublished(request, id: id)
        case .gtmDraft(let id): return try gtmDraft(request, id: id)
        case .gtmPublish(let id): return try gtmPublish(request, id: id)
        case .gtmInspect(let id): return try gtmInspect(id: id)
        case .data(let r): return try data(request, r, principal)
        case .console(let r): return try consoleRoute(request, r, principal)
        }
    }

    // MARK: Endpoints

    /// An ingest request: to the JetStream stream in NATS mode (answered on its ack, through
    /// `answer` when the lane runs it), else into the store.
    private func ingestNow(
        _ request: HTTPRequest, stream: String, _ principal: Principal, into answer: DeferredAnswer?, delay: UInt64
    ) throws(APIError) -> Disposition {
        guard let js = jetstream else { return .respond(try ingest(request, stream: stream, principal), delayMs: delay) }
        try checkDeviceWrite(stream: stream, principal)
        return try ingestToStream(request, stream: stream, js, principal, into: answer ?? DeferredAnswer())
    }

    /// A batch checked now, its store writes left to the lane's group commit, which answers.
    private func ingestWrites(
        _ request: HTTPRequest, stream: String, _ principal: Principal, _ answer: DeferredAnswer
    ) throws(APIError) -> IngestLane.Writes {
        let key = try idempotencyKey(request)
        let batch = try Batch.parse(try decodedBody(request), key: key, stream: stream)
        try checkDeviceWrite(stream: stream, principal)
        let receivedAt = System.wallClockMs()
        var result: Store.IngestResult?
        return IngestLane.Writes(
            write: { [unowned self] () throws(StoreError) in
                result = try store.ingest(batch, receivedAt: receivedAt, installId: principal.installId, deviceId: principal.deviceId)
            },
            done: { [unowned self] error in
                guard let r = result, error == nil else {
                    let e = error ?? .unavailable("not stored")
                    log.error("ingest failed", ["stream": stream, "error": e.description])
                    answer.answer(HTTPResponse(APIError.storage(e)))
                    return
                }
                log.debug("batch", ["stream": stream, "key": key, "accepted": r.accepted, "duplicates": r.duplicates])
                answer.answer(
                    Backend.ingestAnswer(accepted: r.accepted, duplicates: r.duplicates, duplicateBatch: r.duplicateBatch, seq: nil))
            })
    }

    private func ingest(_ request: HTTPRequest, stream: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let key = try idempotencyKey(request)
        let batch = try Batch.parse(try decodedBody(request), key: key, stream: stream)
        try checkDeviceWrite(stream: stream, principal)
        let r: Store.IngestResult
        do throws(StoreError) {
            r = try store.ingest(batch, receivedAt: System.wallClockMs(), installId: principal.installId, deviceId: principal.deviceId)
        } catch {
            log.error("ingest failed", ["stream": stream, "error": error.description])
            throw .storage(error)
        }
        log.debug("batch", ["stream": stream, "key": key, "accepted": r.accepted, "duplicates": r.duplicates])
        return Backend.ingestAnswer(accepted: r.accepted, duplicates: r.duplicates, duplicateBatch: r.duplicateBatch, seq: nil)
    }

    private func inspect(stream: String) throws(APIError) -> HTTPResponse {
        let s = try storage { () throws(StoreError) in try store.summary(stream: stream) }
        return HTTPResponse([
            "stream": .string(stream), "records": .int(s.records), "batches": .int(s.batches),
            "duplicateRecords": .int(s.duplicateRecords), "duplicateBatches": .int(s.duplicateBatches),
        ])
    }

    private func records(_ request: HTTPRequest, stream: String) throws(APIError) -> HTTPResponse {
        let q = request.query
        var limit = Limits.defaultRecordsPage
        var after: Int64 = 0
        if let l = q["limit"] {
            guard let n = Int(l), (1...Limits.maxRecordsPage).contains(n) else {
                throw .badRequest(.invalidRequest, "limit must be an integer in 1...\(Limits.maxRecordsPage)")
            }
            limit = n
        }
        if let a = q["after"] {
            guard let n = Int64(a), n >= 0 else { throw .badRequest(.invalidRequest, "after must be a non-negative integer") }
            after = n
        }
        let rows = try storage { () throws(StoreError) in
            try store.records(stream: stream, after: after, limit: limit, maxBytes: Limits.maxRecordsPageBytes)
        }
        var list: [JSON] = []
        list.reserveCapacity(rows.count)
        for r in rows {
            // Stored data was serialised by json-c from valid JSON, so it parses back.
            let data = (try? JSON.parse(r.data, maxDepth: Limits.maxJSONDepth + 1)) ?? .null
            list.append([
                "seq": .int(r.seq), "id": .string(r.id), "ts": .int(r.ts), "data": data, "deviceId": r.deviceId.map(JSON.string) ?? .null,
            ])
        }
        return HTTPResponse([
            "records": .array(list), "next": rows.last.map { .int($0.seq) } ?? .null,
        ])
    }

    private func statsResponse() throws(APIError) -> HTTPResponse {
        var o: JSONObject = [
            "requests": .int(Int64(stats.requests)), "requestsByPath": stats.requestsByPathJSON,
            "faultsInjected": .int(Int64(stats.faultsInjected)), "refused": .int(Int64(stats.refused)),
            "outputBytes": .int(Int64(outputBudget?.used ?? 0)), "busyRefused": .int(Int64(outputBudget?.refused ?? 0)),
        ]
        // The database's totals; while it cannot be reached the rest is still answered.
        do throws(StoreError) {
            let t = try store.totals()
            o["batches"] = .int(t.batches)
            o["records"] = .int(t.records)
            o["duplicateRecords"] = .int(t.duplicateRecords)
            o["duplicateBatches"] = .int(t.duplicateBatches)
        } catch {
            guard error.status == 503 else { throw .storage(error) }
            o["databaseError"] = .string(error.description)
        }
        if let n = natsStatsJSON { o["nats"] = n }
        if let d = store.engineStatsJSON { o["database"] = d }
        if let lane {
            o["ingestLane"] = [
                "depth": .int(Int64(lane.depth)), "peakDepth": .int(Int64(lane.peakDepth)), "ran": .int(Int64(lane.ran)),
                "commits": .int(Int64(lane.commits)),
            ]
        }
        return HTTPResponse(.object(o))
    }

    private func reset() throws(APIError) -> HTTPResponse {
        guard console.resetEnabled else {
            throw APIError(status: 404, code: .resetDisabled, message: "reset is disabled: start the backend with --enable-reset")
        }
        try storage { () throws(StoreError) in try store.reset() }
        faults = FaultState()
        lane?.held = false
        stats = Stats()
        gtmFetches = [:]
        log.info("reset")
        return HTTPResponse(["ok": true])
    }

    // MARK: Helpers

    /// The body after `Content-Encoding` (identity or gzip; gunzipped to at most `maxBody`).
    func decodedBody(_ request: HTTPRequest) throws(APIError) -> [UInt8] {
        let encoding = request.header("content-encoding")?.lowercased() ?? "identity"
        switch encoding {
        case "identity", "": return request.body
        case "gzip", "x-gzip":
            do throws(GzipError) {
                return try Gzip.decompress(request.body, limit: maxBody)
            } catch  where error.kind == .tooLarge {
                throw .tooLarge("decompressed body exceeds the limit of \(maxBody) bytes")
            } catch {
                throw .badRequest(.invalidRequest, "body is not valid gzip: \(error.description)")
            }
        default:
            throw APIError(
                status: 415, code: .unsupportedEncoding,
                message: "unsupported Content-Encoding \(encoding) (identity or gzip)")
        }
    }

    /// The body as a JSON value (after `Content-Encoding`).
    func jsonBody(_ request: HTTPRequest) throws(APIError) -> JSON {
        try parseJSONBody(try decodedBody(request))
    }

    func storage<T>(_ body: () throws(StoreError) -> T) throws(APIError) -> T {
        do throws(StoreError) {
            return try body()
        } catch {
            log.error("storage failed", ["error": error.description])
            throw .storage(error)
        }
    }

}
