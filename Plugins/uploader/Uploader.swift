import PylonHTTP
import PylonPluginKit
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// Built once the host's welcome named the configuration and the state directory
/// (`Uploader.open`, from `onReady`), with its dependencies as constants.
final class Uploader {
    let plugin: Plugin
    let store: UploaderStore
    let http: HTTPClient
    var streams: [String: StreamState] = [:]
    let config: UploaderConfig
    var limits: UploaderLimits { config.limits }
    var retry: RetryPolicy { config.retry }
    var fsyncFull: Bool { config.fsyncFull }
    var diskBytes = 0
    /// The first writer of each stream, as recorded in the queue database.
    var recordedOwners: [String: StreamOwner] = [:]
    /// Bytes and streams per owner: the disk cap's fair shares.
    var ledger = OwnerLedger()
    /// One timer, armed for the earliest moment a stream may have to send (`StreamState.nextWake`);
    /// idle while every stream waits for an event.
    private let wakeTimer: Timer
    private var wakeArmedForMs: UInt64?
    private let commitTimer: Timer
    private var rng = SplitMix64(seed: UInt64(truncatingIfNeeded: System.wallClockMs()))
    /// An enqueue waiting for the next group commit. `keep` holds what the records point into
    /// (besides `call`).
    struct QueuedEnqueue {
        let call: Call
        let stream: String
        let owner: StreamOwner
        let consent: String
        let records: [PendingRecord]
        let bytes: Int
        let keep: AnyObject?
    }
    private var commitQueue: [QueuedEnqueue] = []
    private var commitQueueBytes = 0
    /// A `uploader.flush {wait: true}` caller and, per stream it flushed, the stream's
    /// `delivered` and `setAside` counters at the flush: its answer reports the difference.
    struct DrainWaiter {
        let call: Call
        var base: [String: (delivered: UInt64, setAside: UInt64)]
    }
    /// `uploader.flush {wait:true}` callers, answered when their stream is drained.
    var drainWaiters: [String: [DrainWaiter]] = [:]
    /// `uploader.flush {wait: true}` without a stream: answered when every stream it flushed (the
    /// caller's) is drained.
    var multiDrainWaiters: [DrainWaiter] = []
    /// Per-endpoint "not before" from Retry-After.
    private var endpointNotBefore: [String: UInt64] = [:]
    /// The pixel sender's lanes (GET streams, `Uploader+Get`).
    var pixelSender: PixelSender
    var commits: UInt64 = 0
    /// Hand-overs and releases by `uploader.setOwner` since the start (`uploader.status`).
    var ownerChanges: UInt64 = 0
    /// Set by `shutdown`: a compression finishing later sends nothing.
    private var stopped = false
    /// Runs `applyDeliveredDeletes` when no group commit took the delivered batches within
    /// `deliveredDeleteDelayMs`.
    private let deleteTimer: Timer
    /// How long a delivered batch's deletion waits for a group commit to join before it runs in
    /// a transaction of its own. Waiting changes nothing a caller sees: every commit deletes the
    /// waiting batches before its duplicate check, the disk cap's bytes are released at once,
    /// and a crash meanwhile only sends the batch again under its key. Run on the next turn
    /// instead, about two in three deletions at 64 in flight had a transaction of their own
    /// (~140 µs each); with 20 ms, about one in twenty-five.
    static let deliveredDeleteDelayMs: UInt64 = 20
    /// `uploader.status` names at most this many quarantined segment files (`quarantinedFiles`
    /// counts them all).
    static let maxQuarantinedNamesShown = 32

    typealias Loaded = LoadedBatch

    init(plugin: Plugin, config: UploaderConfig, store: UploaderStore) {
        self.plugin = plugin
        self.config = config
        self.store = store
        http = HTTPClient(loop: plugin.loop)
        pixelSender = PixelSender(schedule: PixelScheduler(limits: config.pixels))
        wakeTimer = Timer(loop: plugin.loop) {}
        commitTimer = Timer(loop: plugin.loop) {}
        deleteTimer = Timer(loop: plugin.loop) {}
        wakeTimer.callback = { [unowned self] in
            self.wakeArmedForMs = nil
            self.pumpAll()
        }
        commitTimer.callback = { [unowned self] in self.commit() }
        deleteTimer.callback = { [unowned self] in self.applyDeliveredDeletes() }
    }

    var now: UInt64 { plugin.loop.nowMs }

    /// Reads the configuration, opens the queue and recovers its state (the plugin exits 78 when
    /// any of that fails): the service `onReady` builds.
    static func open(_ plugin: Plugin) -> Uploader {
        let config: UploaderConfig
        do {
            config = try UploaderConfig(plugin.config)
        } catch {
            plugin.log.error("invalid uploader configuration", ["error": error.description])
            System.exit(exitStatusConfigError)
        }
        let store: UploaderStore
        do {
            store = try UploaderStore(
                path: plugin.stateDir + "/uploader.db", fsyncEveryCommit: config.fsyncFull,
                segmentBytes: UploaderStore.segmentBytes(maxDiskBytes: config.limits.maxDiskBytes), compression: config.queueCompression)
        } catch {
            plugin.log.error("cannot open the queue database", ["error": "\(error)"])
            System.exit(exitStatusConfigError)
        }
        let u = Uploader(plugin: plugin, config: config, store: store)
        u.recover()
        return u
    }

    /// The queue's state from the database, then the consent reconciliation.
    private func recover() {
        do {
            if store.damagedRecords > 0 {
                plugin.log.error("damaged records dropped from the queue", ["records": store.damagedRecords])
            }
            // Once each, when set aside: what was in them is lost to the queue.
            for q in store.log.quarantinedNow {
                plugin.log.error("queue segment quarantined: its records are lost to the queue", ["file": q.file, "reason": q.reason])
            }
            for t in store.log.tightened { t.report(to: plugin.log) }
            diskBytes = try store.totalBytes()
            for (name, o) in try store.recordedOwners() { recordedOwners[name] = StreamOwner(o) }
            for (name, s) in try store.summaries() {
                var st = newState(name)
                st.queued = s.queued
                st.queuedBytes = s.queuedBytes
                st.oldestMs = s.oldestMs.map { monotonic(fromWall: $0) }
                st.pendingBatches = s.pendingBatches
                streams[name] = st
            }
            // Saved settings override only what they hold; maxBatchBytes and the endpoint come
            // from the config (an endpoint a caller saved before endpoints became operator-only
            // is ignored).
            for (name, v) in try store.savedSettings() {
                var st = state(name)
                st.settings.maxCount = v.maxCount
                st.settings.intervalMs = v.intervalMs
                streams[name] = st
            }
            for (name, bytes) in try store.streamBytes() {
                var st = state(name)
                st.diskBytes = bytes
                if let o = st.owner { ledger.add(o, bytes) }
                streams[name] = st
            }
            // Dead letters count in the disk cap and their owner's share until re-queued or discarded.
            for (name, d) in try store.deadLetterSummaries() {
                var st = state(name)
                st.deadLetters = UInt64(d.count)
                st.deadLetterBytes = d.bytes
                diskBytes += d.bytes
                if let o = st.owner { ledger.add(o, d.bytes) }
                streams[name] = st
            }
            for name in recordedOwners.keys { if let o = state(name).owner { ledger.addStream(o) } }
        } catch {
            plugin.log.error("cannot open the queue database", ["error": "\(error)"])
            System.exit(exitStatusConfigError)
        }
        let pending = streams.values.reduce(0) { $0 + $1.pendingBatches.count }
        plugin.log.info(
            "uploader ready",
            [
                "streams": streams.count, "queued_bytes": diskBytes, "pending_batches": pending,
                "fsync": fsyncFull ? "full" : "normal",
            ])
        // A switch denied while the uploader was down applies to what it queued before.
        reconcileConsent()
    }

    func shutdown() {
        stopped = true
        commit()
        applyDeliveredDeletes()
        http.shutdown()
        store.close()
    }

    /// Converts a stored wall-clock time to the loop's monotonic clock (for ages after restart).
    func monotonic(fromWall ms: Int64) -> UInt64 {
        let age = max(0, System.wallClockMs() - ms)
        return now >= UInt64(age) ? now - UInt64(age) : 0
    }

    /// A stream's state before anything happened to it: its configured settings, its fixed
    /// consent switch and its owner.
    func newState(_ stream: String) -> StreamState {
        var st = StreamState(settings: config.catalog.settings(for: stream, defaultEndpoint: config.defaultEndpoint))
        st.owner = config.catalog.owner(of: stream, recorded: recordedOwners[stream])
        st.consentKey = config.catalog.consentKey(for: stream)
        return st
    }

    func state(_ stream: String) -> StreamState { streams[stream] ?? newState(stream) }

    /// The switch a refusal names: `device` while the master switch is denied.
    func deniedSwitch(_ key: String) -> String { plugin.consentMaster ? key : "device" }

    /// Records of a stream of `owner` left the disk (delivered, purged or set aside).
    func release(owner: StreamOwner?, bytes: Int) {
        diskBytes = max(0, diskBytes - bytes)
        if let o = owner { ledger.remove(o, bytes) }
    }

    /// Records of a stream of `owner` were set aside: they stay on disk as dead letters.
    func charge(owner: StreamOwner?, bytes: Int) {
        diskBytes += bytes
        if let o = owner { ledger.add(o, bytes) }
    }

    // MARK: Enqueue (group commit)

    static func validStream(_ s: String) -> Bool {
        var s = s
        return s.withUTF8 { b in
            guard !b.isEmpty, b.count <= 128 else { return false }
            for c in b {
                guard
                    (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2E || c == 0x2D
                        || c == 0x5F || c == 0x3A
                else { return false }
            }
            return true
        }
    }

    /// `{stream, consent?, records}` served from the params' text (`Call.paramsText`; the method
    /// reads `.text`): the records are read from its bytes (`EnqueueParams.read(raw:)`, the one reader).
    func enqueue(_ call: Call) {
        let wall = System.wallClockMs()
        let caller = Principal(caller: call.callerInfo)  // the kit reads a repeated caller text once
        let p = EnqueueParams.read(raw: call.paramsText, limits: limits, wall: wall, scratch: &rawScratch)
        enqueue(call, caller: caller, p, keep: p.storage)
    }

    /// What the reader walks into, reused by every enqueue.
    private var rawScratch = EnqueueParams.Scratch()

    /// The enqueue's checks and queueing. The caller must own
    /// the stream (or be an admin); the records fall under the stream's fixed consent switch,
    /// which `consent`, if given, must name. `keep` holds what the records point into (besides
    /// `call`) until the group commit.
    func enqueue(_ call: Call, caller: Principal, _ p: EnqueueParams, keep: AnyObject?) {
        guard let stream = p.stream else {
            call.fail(EnqueueParams.streamError)
            return
        }
        // The stream's owner and switch, read in place (one lookup, no copy of its state).
        let known = streams.index(forKey: stream)
        let (streamOwner, consent, getHosts) =
            known.map { (streams.values[$0].owner, streams.values[$0].consentKey, streams.values[$0].settings.getHosts) }
            ?? (
                config.catalog.owner(of: stream, recorded: recordedOwners[stream]), config.catalog.consentKey(for: stream),
                config.catalog.value(stream, \.getHosts)
            )
        let owner: StreamOwner
        switch StreamAccess.decide(stream, owner: streamOwner, caller: caller, action: "enqueue to", claims: true) {
        case .refused(let e): call.fail(e); return
        case .allowed(let o?, _): owner = o
        case .allowed(nil, _): call.fail(RPCError(.notPermitted, "stream \(stream) has no owner")); return
        }
        if p.consent != .absent, p.consent != .named(consent) {
            call.fail(
                RPCError(
                    .invalidParams,
                    "stream \(stream) falls under consent switch \(consent): params.consent must be \"\(consent)\" or absent",
                    data: ["switch": .string(consent)]))
            return
        }
        guard allows(consent) else {
            streams[stream]?.refusedConsent += 1
            let sw = deniedSwitch(consent)
            call.fail(RPCError(.consentDenied, "consent switch \(sw) is denied", data: ["switch": .string(sw)]))
            return
        }
        let records: [PendingRecord]
        let bytes: Int
        switch p.records {
        case .failure(let e): call.fail(e); return
        case .success(let r): (records, bytes) = r
        }
        if let getHosts, let e = Uploader.getURLError(records, hosts: getHosts) {
            call.fail(e)
            return
        }
        let newStream = recordedOwners[stream] == nil
        if let e = ledger.admit(owner, bytes: bytes, newStream: newStream, totalBytes: diskBytes + commitQueueBytes, limits: limits) {
            call.fail(e)
            return
        }
        if newStream {
            guard register(stream, owner: owner) else {
                call.fail(RPCError(.internalError, "could not record the owner of stream \(stream)"))
                return
            }
        }
        commitQueue.append(
            QueuedEnqueue(call: call, stream: stream, owner: owner, consent: consent, records: records, bytes: bytes, keep: keep))
        commitQueueBytes += bytes
        ledger.reserve(owner, bytes)
        // Commit after the current read is dispatched: every enqueue that arrived with it shares
        // one transaction (and one fsync with "fsync": "full").
        if !commitTimer.isActive { commitTimer.start(after: 0) }
    }

    /// Records the owner of a stream written for the first time (durably: ownership survives
    /// restarts) and counts it against the owner's streams.
    func register(_ stream: String, owner: StreamOwner) -> Bool {
        do {
            try store.recordOwner(stream: stream, owner: owner.description, nowMs: System.wallClockMs())
        } catch {
            plugin.log.error("cannot record a stream owner", ["stream": stream, "error": "\(error)"])
            return false
        }
        recordedOwners[stream] = owner
        ledger.addStream(owner)
        var st = state(stream)
        if st.owner == nil {
            // A stream queued before owners were recorded: its bytes are now its owner's.
            st.owner = owner
            ledger.add(owner, st.diskBytes + st.deadLetterBytes)
        }
        streams[stream] = st
        return true
    }

    /// Deletes the delivered batches no group commit took (`UploaderStore.deleteDelivered`).
    func applyDeliveredDeletes() {
        do {
            try store.applyDeliveredDeletes()
        } catch {
            // The batches stay on disk and go again after a restart (the backend keeps them once).
            plugin.log.error("cannot delete delivered batches", ["batches": store.deliveredQueue.count, "error": "\(error)"])
        }
    }

    func commit() {
        guard !commitQueue.isEmpty else { return }
        let batch = commitQueue
        commitQueue.removeAll(keepingCapacity: true)
        commitQueueBytes = 0
        let added: [(added: Int, bytes: Int)]
        do {
            added = try store.commit(
                batch.map { UploaderStore.Enqueue(stream: $0.stream, consent: $0.consent, records: $0.records) },
                nowMs: System.wallClockMs())
        } catch {
            plugin.log.error("commit failed; enqueues refused", ["error": "\(error)", "calls": batch.count])
            for e in batch {
                ledger.committed(e.owner, reserved: e.bytes, stored: 0)
                e.call.fail(RPCError(.internalError, "could not store records: \(error)"))
            }
            return
        }
        commits += 1
        let t = now
        var reply: [UInt8] = []
        reply.reserveCapacity(48)
        var i = 0
        while i < batch.count {
            // A run of enqueues to one stream by one owner: one update of its state and ledger
            // (the updates add up).
            let stream = batch[i].stream
            let owner = batch[i].owner
            var end = i
            var n = 0
            var stored = 0
            var reserved = 0
            while end < batch.count, batch[end].stream == stream, batch[end].owner == owner {
                n += added[end].added
                stored += added[end].bytes
                reserved += batch[end].bytes
                end += 1
            }
            ledger.committed(owner, reserved: reserved, stored: stored)
            // Exact bytes of the new rows: duplicates add nothing.
            streams[stream, default: newState(stream)].committed(added: n, bytes: stored, now: t)
            diskBytes += stored
            for k in i..<end {
                // The answer is built as text: no json-c objects on the hot path.
                let a = added[k].added
                reply.removeAll(keepingCapacity: true)
                reply.append(contentsOf: #"{"accepted":"#.utf8)
                JSONText.appendDecimal(a, to: &reply)
                reply.append(contentsOf: #","duplicates":"#.utf8)
                JSONText.appendDecimal(batch[k].records.count - a, to: &reply)
                reply.append(UInt8(ascii: "}"))
                batch[k].call.reply(serialized: reply)
            }
            i = end
        }
        // The answers leave before any batch is cut, read and compressed: the drain side's work
        // does not sit between a commit and its acknowledgements.
        plugin.loop.flushDirty()
        pumpAll()
    }

    // MARK: Sending

    func pumpAll() {
        let t = now
        for name in streams.keys { pump(name, now: t) }
        armWake()
    }

    /// Arms the wake timer for the earliest stream that will need a look without an event.
    func armWake() {
        let t = now
        var next = pixelWake(now: t)
        for st in streams.values where st.settings.getHosts == nil {
            guard var w = st.nextWake(now: t) else { continue }
            if let nb = endpointNotBefore[st.settings.endpoint], nb > w { w = nb }
            next = min(next ?? w, w)
        }
        guard let next else {
            wakeTimer.stop()
            wakeArmedForMs = nil
            return
        }
        if let armed = wakeArmedForMs, armed == next { return }
        wakeArmedForMs = next
        // At least 1 ms: a zero timer started from the timer's own callback would run again in
        // the same loop phase.
        wakeTimer.start(after: max(1, next > t ? next - t : 0))
    }

    /// Does what stream `name`'s machine asks until it waits: cuts, a send, and the work ahead
    /// of the next batch while that one is in flight.
    func pump(_ name: String, now t: UInt64) {
        guard var st = streams[name] else { return }
        // A GET stream's pixels go by their lanes (`Uploader+Get`).
        if st.settings.getHosts != nil {
            pumpGet(name, now: t)
            return
        }
        while true {
            switch st.poll(now: t, endpointHeldUntil: endpointNotBefore[st.settings.endpoint]) {
            case .idle:
                streams[name] = st
                answerDrainWaiters(name, st)
                return
            case .cut(let maxCount, let maxBytes):
                let key = System.randomHex(16)
                do {
                    let (n, bytes) = try store.cutBatch(
                        stream: name, key: key, maxCount: maxCount, maxBytes: maxBytes,
                        final: false, nowMs: System.wallClockMs())
                    st.cut(batch: key, count: n, bytes: bytes)
                } catch {
                    plugin.log.error("cannot cut a batch", ["stream": name, "error": "\(error)"])
                    // A cut ahead that failed waits for the flight to end; otherwise the stream waits.
                    if !st.inFlight { st.storeFailed(now: t) }
                }
            case .send(let key):
                streams[name] = st
                send(stream: name, key: key, endpoint: st.settings.endpoint)
                // The work ahead waits for the next turn: curl writes the request from a zero
                // timer, which runs first then; done now, the cut and read of the next batch
                // would hold the request back.
                plugin.loop.nextTurn { [unowned self] in
                    self.pump(name, now: self.now)
                    self.armWake()
                }
                return
            case .prepare(let key):
                st.startPreparing(key)
                streams[name] = st
                load(key, stream: name) { [unowned self] loaded in self.prepared(stream: name, key: key, loaded) }
                // The read may have finished at once (an empty batch, a failure).
                st = streams[name] ?? st
            }
        }
    }

    /// Posts batch `key`: the one prepared ahead if it is that one (when it is still
    /// compressing, once it is done), else read and compressed now.
    func send(stream: String, key: String, endpoint: String) {
        guard var st = streams[stream] else { return }
        let start = st.startSend(key, to: endpoint)
        streams[stream] = st
        switch start {
        case .waitForCompression: break
        case .upload(let loaded): upload(loaded, key: key, stream: stream, endpoint: endpoint)
        case .load: load(key, stream: stream) { [unowned self] loaded in self.prepared(stream: stream, key: key, loaded) }
        }
    }

    /// Batch `key` was read and compressed (nil: it failed): posted, kept for its send, or the
    /// stream backs off, as its machine says.
    private func prepared(stream: String, key: String, _ loaded: Loaded?) {
        guard var st = streams[stream] else { return }
        let end = st.preparationFinished(key, loaded)
        streams[stream] = st
        switch end {
        case .nothing, .kept: break
        case .upload(let loaded, let endpoint): upload(loaded, key: key, stream: stream, endpoint: endpoint)
        case .failed:
            streams[stream]?.storeFailed(now: now)
            armWake()
        }
    }

    /// Reads batch `key` from disk and compresses it on libuv's thread pool; `done` gets it on
    /// the loop (an empty batch at once, nil after a logged failure; never after shutdown).
    private func load(_ key: String, stream: String, _ done: @escaping (Loaded?) -> Void) {
        let batch: (body: [UInt8], count: Int, recordBytes: Int)
        do {
            batch = try store.batchBody(key, stream: stream)
        } catch {
            plugin.log.error("cannot load batch", ["batch": key, "error": "\(error)"])
            done(nil)
            return
        }
        if batch.count == 0 {
            done(Loaded(gz: [], count: 0, recordBytes: 0))
            return
        }
        // Compressed on libuv's thread pool: a full batch takes ~0.3-0.5 ms of deflate, which on
        // the loop sat between the next enqueues and their commit. Level 1: on event JSON it
        // compresses within ~2% of level 6 at less than half the CPU (500 MA events: 144 KB ->
        // 4.8 KB in 0.23 ms vs 4.7 KB in 0.57 ms).
        let body = batch.body
        plugin.loop.runOnThreadPool({ () -> Result<[UInt8], GzipError> in
            Result { () throws(GzipError) in try Gzip.compress(body, level: 1) }
        }) { [unowned self] compressed in
            // Stopping: the batch stays on disk, cut, and goes after the restart.
            guard !self.stopped else { return }
            switch compressed {
            case .success(let gz): done(Loaded(gz: gz, count: batch.count, recordBytes: batch.recordBytes))
            case .failure(let error):
                self.plugin.log.error("gzip failed", ["error": "\(error)"])
                done(nil)
            }
        }
    }

    /// Posts a loaded batch; one that held no records (delivered before a crash) is deleted and
    /// the next one goes.
    private func upload(_ loaded: Loaded, key: String, stream: String, endpoint: String) {
        guard loaded.count > 0 else {
            dropEmptyBatch(stream, key)
            return
        }
        // Read now, not when it was prepared: consent denied meanwhile makes it final.
        let final: Bool
        do {
            final = try store.isFinal(key)
        } catch {
            batchLoadFailed(stream, key, error)
            return
        }
        let sent = StreamState.SentBatch(key: key, count: loaded.count, bytes: loaded.recordBytes, final: final)
        post(loaded.gz, stream: stream, endpoint: endpoint, batch: sent)
    }

    /// A batch that could not be read from the store: logged; the stream backs off as after any
    /// store failure.
    func batchLoadFailed(_ stream: String, _ key: String, _ error: any Error) {
        plugin.log.error("cannot load batch", ["batch": key, "error": "\(error)"])
        streams[stream]?.storeFailed(now: now)
        armWake()
    }

    /// A batch that holds no records (delivered before a crash): deleted, and the next one goes.
    func dropEmptyBatch(_ stream: String, _ key: String) {
        try? store.deleteBatch(key)
        streams[stream]?.batchWasEmpty(key)
        pump(stream, now: now)
        armWake()
    }

    /// Sends a cut batch's compressed body; `finished` gets the outcome.
    private func post(_ gz: [UInt8], stream: String, endpoint: String, batch sent: StreamState.SentBatch) {
        let key = sent.key
        let url = endpoint.replacingStream(stream)
        let req = HTTPRequest(
            method: "POST", url: url,
            headers: [
                ("Content-Type", "application/json"), ("Content-Encoding", "gzip"), ("Idempotency-Key", key),
            ] + DeviceCredential.headers(config.credentialFile, log: plugin.log), body: gz, timeoutMs: limits.requestTimeoutMs)
        http.send(req) { [unowned self] r in
            let outcome: UploadOutcome
            switch r {
            case .success(let resp):
                outcome = UploadOutcome.classify(status: resp.status, retryAfterMs: resp.retryAfterMs, error: nil)
            case .failure(let e):
                outcome = UploadOutcome.classify(status: nil, retryAfterMs: nil, error: e.description)
            }
            self.finished(stream: stream, endpoint: endpoint, batch: sent, outcome: outcome)
        }
    }

    /// An upload came back: do what the machine says with the batch on disk, report it, and do
    /// the bookkeeping it returns.
    func finished(stream: String, endpoint: String, batch sent: StreamState.SentBatch, outcome: UploadOutcome) {
        guard var st = streams[stream] else { return }
        // Consent denied while the batch was at the backend made it final on disk: its one send
        // is done, so a retry purges it, a 413 sets it aside and a delivery zeroes it, rather
        // than sending it again or returning its records to the queue.
        var batch = sent
        if !batch.final, (try? store.isFinal(batch.key)) == true { batch.final = true }
        var diskOK = true
        var deadLettered = (count: 0, bytes: 0)
        var dissolvedAhead = false
        do {
            switch StreamState.disposal(of: batch, outcome) {
            case .delete where batch.final:
                try store.deleteBatch(batch.key, zero: true)
            case .delete:
                // Joins the next group commit, or a transaction of its own if none comes soon.
                store.deleteDelivered(batch.key)
                if !deleteTimer.isActive { deleteTimer.start(after: Uploader.deliveredDeleteDelayMs) }
            case .keep: break
            case .unbatch:
                // The batch cut behind this one goes back too, unless it became final.
                if let a = st.cutAhead, !(try store.isFinal(a.key)) {
                    try store.unbatch([batch.key, a.key])
                    st.dropPreparation(a.key)
                    dissolvedAhead = true
                } else {
                    try store.unbatch([batch.key])
                }
            case .deadLetter(let status, let reason):
                deadLettered = try store.deadLetter(batch.key, status: status, reason: reason, nowMs: System.wallClockMs())
            }
        } catch {
            diskOK = false
            plugin.log.error("queue update failed", ["stream": stream, "batch": batch.key, "error": "\(error)"])
        }
        let t = now
        for effect in st.uploadFinished(
            batch, outcome, diskOK: diskOK, deadLettered: deadLettered.count, deadLetterBytes: deadLettered.bytes,
            dissolvedAhead: dissolvedAhead, now: t,
            retry: retry, random: rng.nextUnit())
        {
            switch effect {
            case .release(let bytes): release(owner: st.owner, bytes: bytes)
            case .charge(let bytes): charge(owner: st.owner, bytes: bytes)
            case .holdEndpoint(let until): endpointNotBefore[endpoint] = until
            }
        }
        switch outcome {
        case .retry(let reason, _) where !batch.final:
            plugin.log.warn(
                "upload failed; will retry", ["stream": stream, "batch": batch.key, "reason": reason, "in_ms": st.lastRetryDelayMs])
        case .rejected(let status, _):
            plugin.log.error("batch rejected; dead-lettered", ["stream": stream, "batch": batch.key, "status": status])
        default: break
        }
        streams[stream] = st
        pump(stream, now: t)
        armWake()
    }
}

extension String {
    func replacingStream(_ stream: String) -> String {
        guard let r = range(of: "{stream}") else { return self }
        return String(self[..<r.lowerBound]) + stream + String(self[r.upperBound...])
    }
}
