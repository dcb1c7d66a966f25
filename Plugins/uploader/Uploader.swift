import CJSONC
import PylonHTTP
import PylonPluginKit
import PylonStore

/// Named limits of the uploader (each configurable in the plugin's config section).
struct UploaderLimits {
    /// Disk cap for queued records (bytes of record bodies). When full, enqueue is refused with
    /// -32004 and nothing already acknowledged is touched.
    var maxDiskBytes = 64 << 20
    /// Records per enqueue call and bytes per record.
    var maxRecordsPerCall = 1000
    var maxRecordBytes = 256 * 1024
    /// Upload request timeout.
    var requestTimeoutMs = 30_000
}

final class Uploader {
    let plugin: Plugin
    var store: UploaderStore!
    var http: HTTPClient!
    var streams: [String: StreamState] = [:]
    var limits = UploaderLimits()
    var retry = RetryPolicy()
    var defaultEndpoint = "http://127.0.0.1:8780/v1/batches/{stream}"
    var streamDefaults: [String: JSON] = [:]
    var fsyncFull = false
    var diskBytes = 0
    private var tick: Timer!
    private var commitTimer: Timer!
    private var rng = SplitMix64(seed: UInt64(truncatingIfNeeded: System.wallClockMs()))
    /// Enqueues waiting for the next group commit.
    private var commitQueue: [(call: Call, stream: String, consent: String, records: [PendingRecord], bytes: Int)] = []
    private var commitQueueBytes = 0
    /// `uploader.flush {wait:true}` callers, answered when their stream is drained.
    private var drainWaiters: [String: [Call]] = [:]
    /// Per-endpoint "not before" from Retry-After.
    private var endpointNotBefore: [String: UInt64] = [:]
    var commits: UInt64 = 0

    init(plugin: Plugin) { self.plugin = plugin }

    var now: UInt64 { plugin.loop.nowMs }

    func start() {
        let c = plugin.config
        if let e = c["endpoint"]?.stringValue { defaultEndpoint = e }
        if let v = c["maxDiskBytes"]?.intValue { limits.maxDiskBytes = Int(v) }
        if let v = c["requestTimeoutMs"]?.intValue { limits.requestTimeoutMs = Int(v) }
        if let v = c["retryInitialMs"]?.intValue { retry.initialMs = UInt64(v) }
        if let v = c["retryMaxMs"]?.intValue { retry.maxMs = UInt64(v) }
        fsyncFull = c["fsync"]?.stringValue == "full"
        if let s = c["streams"]?.objectValue { for (k, v) in s { streamDefaults[k] = v } }
        do {
            store = try UploaderStore(path: plugin.stateDir + "/uploader.db", fsyncEveryCommit: fsyncFull)
            diskBytes = try store.totalBytes()
            let saved = try store.savedSettings()
            for (name, s) in try store.summaries() {
                var st = StreamState(settings: settings(for: name))
                st.queued = s.queued
                st.queuedBytes = s.queuedBytes
                st.oldestMs = s.oldestMs.map { monotonic(fromWall: $0) }
                st.pendingBatches = s.pendingBatches
                st.deadLetters = UInt64(try store.deadLetterCount(stream: name))
                streams[name] = st
            }
            // Saved settings override only what they hold; maxBatchBytes comes from the config.
            for (name, v) in saved {
                var st = streams[name] ?? StreamState(settings: settings(for: name))
                st.settings.endpoint = v.endpoint
                st.settings.maxCount = v.maxCount
                st.settings.intervalMs = v.intervalMs
                streams[name] = st
            }
        } catch {
            plugin.log.error("cannot open the queue database", ["error": "\(error)"])
            System.exit(78)
        }
        http = HTTPClient(loop: plugin.loop)
        tick = Timer(loop: plugin.loop) { [unowned self] in self.pumpAll() }
        tick.start(after: 50, repeat: 50)
        commitTimer = Timer(loop: plugin.loop) { [unowned self] in self.commit() }
        let pending = streams.values.reduce(0) { $0 + $1.pendingBatches.count }
        plugin.log.info("uploader ready", ["streams": streams.count, "queued_bytes": diskBytes, "pending_batches": pending,
                                           "fsync": fsyncFull ? "full" : "normal"])
        pumpAll()
    }

    func shutdown() {
        commit()
        http?.shutdown()
        store?.db.close()
    }

    /// Converts a stored wall-clock time to the loop's monotonic clock (for ages after restart).
    func monotonic(fromWall ms: Int64) -> UInt64 {
        let age = max(0, System.wallClockMs() - ms)
        return now >= UInt64(age) ? now - UInt64(age) : 0
    }

    /// Settings for a stream: exact config entry, else the longest matching pattern, else defaults.
    func settings(for stream: String) -> StreamSettings {
        var s = StreamSettings(endpoint: defaultEndpoint)
        var best: (Int, JSON)?
        for (pattern, v) in streamDefaults where TopicPattern(pattern).matches(stream) {
            if best == nil || pattern.count > best!.0 { best = (pattern.count, v) }
        }
        if let v = best?.1 {
            if let e = v["endpoint"]?.stringValue { s.endpoint = e }
            if let n = v["maxCount"]?.intValue { s.maxCount = min(max(1, Int(n)), StreamSettings.maxCountLimit) }
            if let n = v["intervalMs"]?.intValue { s.intervalMs = UInt64(max(0, n)) }
            if let n = v["maxBatchBytes"]?.intValue { s.maxBatchBytes = max(1024, Int(n)) }
        }
        return s
    }

    func state(_ stream: String) -> StreamState {
        streams[stream] ?? StreamState(settings: settings(for: stream))
    }

    // MARK: Enqueue (group commit)

    static func validStream(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= 128
            && s.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2E || $0 == 0x2D || $0 == 0x5F || $0 == 0x3A }
    }

    func enqueue(_ call: Call) {
        guard let stream = call.stringParam("stream"), Uploader.validStream(stream) else {
            call.fail(RPCError(.invalidParams, "params.stream is required: 1-128 of [A-Za-z0-9._:-]"))
            return
        }
        let consent = call.stringParam("consent") ?? ""
        if !consent.isEmpty && !plugin.isConsentGranted(consent) {
            var st = state(stream)  // read before writing: no overlapping access to `streams`
            st.refusedConsent += 1
            streams[stream] = st
            call.fail(RPCError(.consentDenied, "consent switch \(consent) is denied", data: ["switch": .string(consent)]))
            return
        }
        // Records are read straight from the parsed json-c tree: no conversion to Swift values.
        let list = call.paramRef("records")
        guard json_object_get_type(list) == json_type_array, json_object_array_length(list) > 0 else {
            call.fail(RPCError(.invalidParams, "params.records must be a non-empty array"))
            return
        }
        let count = json_object_array_length(list)
        guard count <= limits.maxRecordsPerCall else {
            call.fail(RPCError(.invalidParams, "at most \(limits.maxRecordsPerCall) records per call"))
            return
        }
        var records: [PendingRecord] = []
        records.reserveCapacity(count)
        var bytes = 0
        let wall = System.wallClockMs()
        for i in 0..<count {
            let r = json_object_array_get_idx(list, i)
            var idObj: OpaquePointer?
            var dataObj: OpaquePointer?
            var tsObj: OpaquePointer?
            guard json_object_object_get_ex(r, "id", &idObj) != 0, json_object_get_type(idObj) == json_type_string,
                  case let n = json_object_get_string_len(idObj), n > 0, n <= 128, let id = json_object_get_string(idObj)
            else {
                call.fail(RPCError(.invalidParams, "records[\(i)].id must be a non-empty string of at most 128 bytes"))
                return
            }
            // A record is an object `{id, ts?, data}` (the id lookup above fails for anything
            // else); a record without `data` is stored whole.
            if json_object_object_get_ex(r, "data", &dataObj) == 0 { dataObj = r }
            var bodyLen = 0
            guard let body = json_object_to_json_string_length(dataObj, flagsPlain, &bodyLen), bodyLen <= limits.maxRecordBytes else {
                call.fail(RPCError(.invalidParams, "records[\(i)] is larger than \(limits.maxRecordBytes) bytes"))
                return
            }
            var ts = wall
            if json_object_object_get_ex(r, "ts", &tsObj) != 0, json_object_get_type(tsObj) == json_type_int {
                ts = json_object_get_int64(tsObj)
            }
            bytes += bodyLen
            records.append(PendingRecord(id: id, idLength: n, ts: ts, body: body, bodyLength: Int32(bodyLen)))
        }
        if diskBytes + commitQueueBytes + bytes > limits.maxDiskBytes {
            call.fail(RPCError(.overloaded, "uploader queue is full (\(limits.maxDiskBytes) bytes on disk); records refused",
                               data: ["limit": "maxDiskBytes", "value": .int(Int64(limits.maxDiskBytes))]))
            return
        }
        commitQueue.append((call, stream, consent, records, bytes))
        commitQueueBytes += bytes
        // Commit after the current read is dispatched: every enqueue that arrived with it shares
        // one transaction (and one fsync with "fsync": "full").
        if !commitTimer.isActive { commitTimer.start(after: 0) }
    }

    func commit() {
        guard !commitQueue.isEmpty, let store else { return }
        let batch = commitQueue
        commitQueue.removeAll(keepingCapacity: true)
        commitQueueBytes = 0
        let nowWall = System.wallClockMs()
        var added: [(added: Int, bytes: Int)] = []
        added.reserveCapacity(batch.count)
        do {
            try store.db.transaction { () throws(SQLiteError) in
                for e in batch { added.append(try store.insert(stream: e.stream, consent: e.consent, records: e.records, nowMs: nowWall)) }
            }
        } catch {
            plugin.log.error("commit failed; enqueues refused", ["error": "\(error)", "calls": batch.count])
            for e in batch { e.call.fail(RPCError(.internalError, "could not store records: \(error)")) }
            return
        }
        commits += 1
        for (e, r) in zip(batch, added) {
            let n = r.added
            var st = state(e.stream)
            if n > 0 {
                if st.queued == 0 { st.oldestMs = now }
                st.queued += n
                st.queuedBytes += r.bytes  // exact bytes of the new rows: duplicates add nothing
                diskBytes += r.bytes
            }
            streams[e.stream] = st
            let reply = json_object_new_object()
            json_object_object_add(reply, "accepted", json_object_new_int64(Int64(n)))
            json_object_object_add(reply, "duplicates", json_object_new_int64(Int64(e.records.count - n)))
            e.call.replyRaw(owning: reply)
        }
        pumpAll()
    }

    // MARK: Sending

    func pumpAll() {
        let t = now
        for name in streams.keys { pump(name, now: t) }
    }

    func pump(_ name: String, now t: UInt64) {
        guard var st = streams[name], let store else { return }
        let endpoint = st.settings.endpoint
        if let nb = endpointNotBefore[endpoint], t < nb { return }
        guard st.shouldSend(now: t) else {
            answerDrainWaiters(name, st)
            return
        }
        if st.pendingBatches.isEmpty {
            let key = System.randomHex(16)
            let n: Int, cutBytes: Int
            do {
                (n, cutBytes) = try store.cutBatch(stream: name, key: key, maxCount: st.batchLimit,
                                       maxBytes: st.settings.maxBatchBytes, final: false, nowMs: System.wallClockMs())
            } catch {
                plugin.log.error("cannot cut a batch", ["stream": name, "error": "\(error)"])
                return
            }
            guard n > 0 else {
                st.queued = 0; st.queuedBytes = 0; st.oldestMs = nil; st.flushRequested = false
                streams[name] = st
                return
            }
            st.queued -= n
            st.queuedBytes = max(0, st.queuedBytes - cutBytes)  // what stays queued
            if st.queued <= 0 { st.queued = 0; st.queuedBytes = 0; st.oldestMs = nil; st.flushRequested = false }
            st.pendingBatches.append(key)
        }
        let key = st.pendingBatches[0]
        st.inFlight = true
        streams[name] = st
        send(stream: name, key: key, endpoint: endpoint)
    }

    func send(stream: String, key: String, endpoint: String) {
        let batch: (body: [UInt8], count: Int, recordBytes: Int)
        let final: Bool
        do {
            batch = try store.batchBody(key, stream: stream)
            final = try store.isFinal(key)
        } catch {
            plugin.log.error("cannot load batch", ["batch": key, "error": "\(error)"])
            streams[stream]?.inFlight = false
            return
        }
        if batch.count == 0 {
            try? store.deleteBatch(key)
            streams[stream]?.pendingBatches.removeAll { $0 == key }
            streams[stream]?.inFlight = false
            pump(stream, now: now)
            return
        }
        let gz: [UInt8]
        // Level 1: on event JSON it compresses within ~2% of level 6 at less than half the CPU
        // (500 MA events: 144 KB -> 4.8 KB in 0.23 ms vs 4.7 KB in 0.57 ms).
        do { gz = try Gzip.compress(batch.body, level: 1) } catch {
            plugin.log.error("gzip failed", ["error": "\(error)"])
            streams[stream]?.inFlight = false
            return
        }
        let url = endpoint.replacingStream(stream)
        let req = HTTPRequest(method: "POST", url: url, headers: [
            ("Content-Type", "application/json"), ("Content-Encoding", "gzip"), ("Idempotency-Key", key),
        ], body: gz, timeoutMs: limits.requestTimeoutMs)
        http.send(req) { [unowned self] r in
            let outcome: UploadOutcome
            switch r {
            case .success(let resp):
                outcome = UploadOutcome.classify(status: resp.status, retryAfterMs: resp.retryAfterMs, error: nil)
            case .failure(let e):
                outcome = UploadOutcome.classify(status: nil, retryAfterMs: nil, error: e.description)
            }
            self.finished(stream: stream, key: key, endpoint: endpoint, count: batch.count, bytes: batch.recordBytes,
                          final: final, outcome: outcome)
        }
    }

    func finished(stream: String, key: String, endpoint: String, count: Int, bytes: Int, final: Bool, outcome: UploadOutcome) {
        guard var st = streams[stream] else { return }
        st.inFlight = false
        do {
            switch outcome {
            case .delivered:
                try store.deleteBatch(key)
                diskBytes = max(0, diskBytes - bytes)
                st.pendingBatches.removeFirst()
                st.attempts = 0
                st.notBeforeMs = 0
                st.delivered += UInt64(count)
                st.lastResult = "delivered \(count) records"
            case .retry(let reason, let retryAfter):
                if final {
                    try store.deleteBatch(key)
                    diskBytes = max(0, diskBytes - bytes)
                    st.pendingBatches.removeFirst()
                    st.lastResult = "final batch failed (\(reason)); purged without retry"
                } else {
                    st.attempts += 1
                    let delay = StreamState.retryDelay(attempts: st.attempts, policy: retry, retryAfterMs: retryAfter, random: rng.nextUnit())
                    st.notBeforeMs = now + delay
                    st.lastRetryDelayMs = delay
                    if let ra = retryAfter { endpointNotBefore[endpoint] = now + ra }
                    st.lastResult = "retrying: \(reason)"
                    plugin.log.warn("upload failed; will retry", ["stream": stream, "batch": key, "reason": reason, "in_ms": delay])
                }
            case .tooLarge:
                if final || count <= 1 {
                    let n = try store.deadLetter(key, status: 413, reason: "too large for the endpoint", nowMs: System.wallClockMs())
                    st.deadLetters += UInt64(n)
                    st.pendingBatches.removeFirst()
                    diskBytes = max(0, diskBytes - bytes)
                    st.lastResult = "413 for a single record; set aside as a dead letter"
                } else {
                    // Split: dissolve the batch and cut smaller ones from the same records.
                    try store.unbatch(key)
                    st.pendingBatches.removeFirst()
                    st.queued += count
                    st.queuedBytes += bytes
                    if st.oldestMs == nil { st.oldestMs = now }
                    st.countCap = max(1, count / 2)
                    st.flushRequested = true
                    st.lastResult = "413: splitting \(count) records into batches of \(max(1, count / 2))"
                }
            case .rejected(let status, let reason):
                let n = try store.deadLetter(key, status: status, reason: reason, nowMs: System.wallClockMs())
                st.deadLetters += UInt64(n)
                st.pendingBatches.removeFirst()
                diskBytes = max(0, diskBytes - bytes)
                st.lastResult = "rejected (\(reason)); \(n) records set aside as dead letters"
                plugin.log.error("batch rejected; dead-lettered", ["stream": stream, "batch": key, "status": status])
            }
        } catch {
            plugin.log.error("queue update failed", ["stream": stream, "batch": key, "error": "\(error)"])
        }
        if st.pendingBatches.isEmpty && st.queued == 0 { st.countCap = nil }
        streams[stream] = st
        pump(stream, now: now)
    }

    /// `uploader.flush {wait: true}` without a stream: answered when every stream is drained.
    private var allDrainWaiters: [Call] = []

    /// Answers the all-stream flush waiters once every stream is drained.
    private func answerAllDrainWaiters() {
        guard !allDrainWaiters.isEmpty,
              streams.values.allSatisfy({ $0.queued == 0 && $0.pendingBatches.isEmpty && !$0.inFlight })
        else { return }
        let w = allDrainWaiters
        allDrainWaiters.removeAll()
        for c in w { c.reply(["drained": true]) }
    }

    private func answerDrainWaiters(_ stream: String, _ st: StreamState) {
        answerAllDrainWaiters()
        guard st.queued == 0, st.pendingBatches.isEmpty, !st.inFlight, let waiters = drainWaiters.removeValue(forKey: stream) else { return }
        for w in waiters { w.reply(["stream": .string(stream), "drained": true, "lastResult": .string(st.lastResult)]) }
    }

    // MARK: Methods

    func flush(_ call: Call) {
        commit()
        let names: [String]
        if let s = call.params["stream"]?.stringValue { names = [s] } else { names = Array(streams.keys) }
        for n in names {
            var st = state(n)
            st.flushRequested = true
            // A flush also skips a pending retry wait: the caller asked for "now".
            st.notBeforeMs = 0
            streams[n] = st
        }
        let wait = call.params["wait"]?.boolValue ?? false
        if wait {
            if names.count == 1 {
                drainWaiters[names[0], default: []].append(call)
            } else {
                allDrainWaiters.append(call)
                answerAllDrainWaiters()
            }
        } else {
            call.reply(["flushing": .array(names.sorted().map { .string($0) })])
        }
        pumpAll()
    }

    func status() -> JSON {
        var o = JSONObject()
        let t = now
        for name in streams.keys.sorted() {
            let st = streams[name]!
            o[name] = [
                "queued": .int(Int64(st.queued)), "queuedBytes": .int(Int64(st.queuedBytes)),
                "oldestAgeMs": st.oldestMs.map { .int(Int64(t - min(t, $0))) } ?? .null,
                "inFlight": .int(st.inFlight ? 1 : 0), "pendingBatches": .int(Int64(st.pendingBatches.count)),
                "lastResult": .string(st.lastResult), "retryDelayMs": .int(Int64(st.lastRetryDelayMs)),
                "retryInMs": .int(Int64(st.notBeforeMs > t ? st.notBeforeMs - t : 0)),
                "attempts": .int(Int64(st.attempts)),
                "delivered": .int(Int64(st.delivered)), "deadLetters": .int(Int64(st.deadLetters)),
                "refusedConsent": .int(Int64(st.refusedConsent)),
                "maxCount": .int(Int64(st.settings.maxCount)), "intervalMs": .int(Int64(st.settings.intervalMs)),
                "maxBatchBytes": .int(Int64(st.settings.maxBatchBytes)), "endpoint": .string(st.settings.endpoint),
            ]
        }
        return ["streams": .object(o), "diskBytes": .int(Int64(diskBytes)), "maxDiskBytes": .int(Int64(limits.maxDiskBytes)),
                "fsync": fsyncFull ? "full" : "normal", "commits": .int(Int64(commits))]
    }

    func deadLetters(_ call: Call) {
        let limit = Int(max(1, min(call.params["limit"]?.intValue ?? 100, 10_000)))
        do {
            let rows = try store.deadLetters(stream: call.params["stream"]?.stringValue, limit: limit)
            call.reply(["deadLetters": .array(rows.map { r in
                ["stream": .string(r[0].text ?? ""), "id": .string(r[1].text ?? ""),
                 "data": (try? JSON.parse(r[2].text ?? "null")) ?? .null, "batch": .string(r[3].text ?? ""),
                 "status": .int(r[4].int ?? 0), "reason": .string(r[5].text ?? ""), "atMs": .int(r[6].int ?? 0)]
            })])
        } catch {
            call.fail(RPCError(.internalError, "\(error)"))
        }
    }

    /// `{stream, maxCount?, intervalMs?, endpoint?, maxBatchBytes?}`: MA's setMaxEventCacheCount
    /// and setReportInterval land here. Persisted, so they survive restarts.
    func configureStream(_ call: Call) {
        let p = call.params
        guard let name = p["stream"]?.stringValue, Uploader.validStream(name) else {
            call.fail(RPCError(.invalidParams, "params.stream is required"))
            return
        }
        var st = state(name)
        // null restores the configured default (MA's report interval lasts one app session).
        let configured = settings(for: name)
        if p["maxCount"] == JSON.null { st.settings.maxCount = configured.maxCount }
        if p["intervalMs"] == JSON.null { st.settings.intervalMs = configured.intervalMs }
        if let n = p["maxCount"], n != JSON.null {
            guard let v = n.intValue, v >= 1, v <= Int64(StreamSettings.maxCountLimit) else {
                call.fail(RPCError(.invalidParams, "maxCount must be an integer from 1 to \(StreamSettings.maxCountLimit)"))
                return
            }
            st.settings.maxCount = Int(v)
        }
        if let n = p["intervalMs"], n != JSON.null {
            guard let v = n.intValue, v >= 0 else {
                call.fail(RPCError(.invalidParams, "intervalMs must be a non-negative integer"))
                return
            }
            st.settings.intervalMs = UInt64(v)
        }
        if let e = p["endpoint"]?.stringValue { st.settings.endpoint = e }
        if let b = p["maxBatchBytes"]?.intValue, b >= 1024 { st.settings.maxBatchBytes = Int(b) }
        do {
            try store.saveSettings(stream: name, maxCount: st.settings.maxCount, intervalMs: st.settings.intervalMs, endpoint: st.settings.endpoint)
        } catch {
            call.fail(RPCError(.internalError, "\(error)"))
            return
        }
        streams[name] = st
        call.reply(["stream": .string(name), "maxCount": .int(Int64(st.settings.maxCount)),
                    "intervalMs": .int(Int64(st.settings.intervalMs)), "endpoint": .string(st.settings.endpoint)])
        pump(name, now: now)
    }

    // MARK: Consent

    /// A denied switch: what was queued under it before the change goes once as a final batch
    /// (no retry), then is purged. The host refuses new enqueues under it from now on.
    func consentChanged(key: String, granted: Bool) {
        guard !granted, let store else { return }
        commit()  // anything accepted before the change is part of the final batch
        do {
            try store.markFinal(consent: key)
            for name in try store.streams(withConsent: key) {
                var st = state(name)
                while true {
                    let bkey = System.randomHex(16)
                    let (n, cutBytes) = try store.cutBatch(stream: name, key: bkey, maxCount: StreamSettings.maxCountLimit,
                                                           maxBytes: st.settings.maxBatchBytes, final: true, consent: key,
                                                           nowMs: System.wallClockMs())
                    if n == 0 { break }
                    st.pendingBatches.append(bkey)
                    st.queued = max(0, st.queued - n)
                    st.queuedBytes = max(0, st.queuedBytes - cutBytes)
                }
                if st.queued == 0 { st.queuedBytes = 0; st.oldestMs = nil }
                st.notBeforeMs = 0
                streams[name] = st
            }
            plugin.log.info("consent denied: final batches queued", ["switch": key])
        } catch {
            plugin.log.error("consent purge failed", ["switch": key, "error": "\(error)"])
        }
        pumpAll()
    }
}

extension String {
    func replacingStream(_ stream: String) -> String {
        guard let r = range(of: "{stream}") else { return self }
        return String(self[..<r.lowerBound]) + stream + String(self[r.upperBound...])
    }
}
