import PylonCore
import PylonHTTP
import PylonPluginKit
import PylonStore

/// Sending: each stream's machine polled (`pump`) and what it asks done — cuts, sends, the
/// batches read and compressed ahead (`StreamState+Preparation.swift`) — the upload, and what
/// its outcome does to the batch on disk (`finished`).
extension Uploader {
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
