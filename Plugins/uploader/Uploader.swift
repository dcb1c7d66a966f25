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
    let wakeTimer: Timer
    var wakeArmedForMs: UInt64?
    private let commitTimer: Timer
    var rng = SplitMix64(seed: UInt64(truncatingIfNeeded: System.wallClockMs()))
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
    var endpointNotBefore: [String: UInt64] = [:]
    /// The pixel sender's lanes (GET streams, `Uploader+Get`).
    var pixelSender: PixelSender
    var commits: UInt64 = 0
    /// Hand-overs and releases by `uploader.setOwner` since the start (`uploader.status`).
    var ownerChanges: UInt64 = 0
    /// Set by `shutdown`: a compression finishing later sends nothing.
    private(set) var stopped = false
    /// Runs `applyDeliveredDeletes` when no group commit took the delivered batches within
    /// `deliveredDeleteDelayMs`.
    let deleteTimer: Timer
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

}

extension String {
    func replacingStream(_ stream: String) -> String {
        guard let r = range(of: "{stream}") else { return self }
        return String(self[..<r.lowerBound]) + stream + String(self[r.upperBound...])
    }
}
