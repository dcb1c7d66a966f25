import PylonHTTP
import PylonPluginKit

/// GET streams (`"delivery": "get"`, such as GTM's `_img` pixels in `gtm.pixels`): each record is
/// one HTTP GET of its `data.url`, delivered through the same queue as every other record, so
/// data still leaves the machine through one door: durably (the record is on disk before the
/// enqueue is answered), under the stream's consent switch, only to the destinations the
/// operator allowed for the stream (`allowedHosts`: host and port, `EndpointRule`).
///
/// Unlike a POST stream, a GET stream is not one line: each queued record is cut into a batch of
/// its own and handed to the pixel sender's lanes (`PixelScheduler`, one per stream, owner and
/// destination), which decide what goes when, so a failing destination holds only its own
/// pixels. A 2xx or 3xx (the redirect is not followed) deletes the record; a 401, 403 or other
/// 4xx sets it aside at once; a network error, 5xx, 408 or 429 is retried with the lane's own
/// backoff, up to `pixels.maxAttempts` tries, and then set aside.
extension Uploader {
    /// The pixel sender's state in the shell: the schedule and what the shell still owes it.
    struct PixelSender {
        var schedule: PixelScheduler
        /// GET streams whose pending batches were looked through since the start or the last
        /// consent change (a scan registers batches cut before a restart and purges final ones).
        var scanned: Set<String> = []
        /// `pumpGet` is running; a nested call (a purge or an answer reports back) only asks for
        /// another round.
        var pumping = false
        var again: Set<String> = []
        /// A GET stream whose last cut failed (the disk) cuts again only after this time.
        var cutHeldUntil: [String: UInt64] = [:]
        /// Records cut into pixels per round; more wait for the next turn.
        static let cutsPerRound = 256
    }

    /// The first record of `records` whose `data.url` is not an `http`/`https` URL to a
    /// destination in `hosts` (the rules of `EndpointRule`: no credentials, no spaces or control
    /// characters, host and port allowed), as the enqueue's -32602.
    static func getURLError(_ records: [PendingRecord], hosts: Set<String>) -> RPCError? {
        for (i, r) in records.enumerated() {
            let data = UnsafeRawBufferPointer(start: r.body, count: Int(r.bodyLength))
            let url = (try? JSONRef.parse(data, maxDepth: Plugin.maxDepth))?.json["url"]?.stringValue
            guard let url else {
                return RPCError(.invalidParams, "records[\(i)].data.url is required on a GET stream: the URL to request")
            }
            if case .failure(let why) = EndpointRule.check(url, allowedHosts: hosts) {
                return RPCError(
                    .invalidParams, "records[\(i)].data.url is not allowed: \(why.description) (the stream's allowedHosts)",
                    data: ["param": "url"])
            }
        }
        return nil
    }

    /// A GET stream's turn: registers its pending pixels once (after the start or a consent
    /// change; final ones are purged), cuts what the queue says to send into one-record batches
    /// for the lanes, and requests what the lanes let go now.
    func pumpGet(_ name: String, now t: UInt64) {
        if pixelSender.pumping {
            pixelSender.again.insert(name)
            return
        }
        pixelSender.pumping = true
        var next: String? = name
        while let n = next {
            pumpGetRound(n, now: now)
            next = pixelSender.again.popFirst()
        }
        pixelSender.pumping = false
    }

    private func pumpGetRound(_ name: String, now t: UInt64) {
        guard var st = streams[name], let hosts = st.settings.getHosts else { return }
        if !pixelSender.scanned.contains(name) {
            var complete = true
            var purge: [String] = []
            for key in st.pendingBatches where !pixelSender.schedule.isInFlight(key) {
                if (try? store.isFinal(key)) == true {
                    pixelSender.schedule.remove(key)
                    purge.append(key)
                } else if !pixelSender.schedule.contains(key) {
                    guard pixelSender.schedule.hasRoom else {
                        complete = false
                        break
                    }
                    if !registerPixel(name, key, hosts: hosts) { complete = false }
                }
            }
            if complete { pixelSender.scanned.insert(name) }
            // Purged without a request: a GET after the denial would hand the hit to the URL's host.
            for key in purge { sendPixel(stream: name, key: key, hosts: hosts) }
            guard let s = streams[name] else { return }
            st = s
        }
        var cuts = 0
        let cutHeld = pixelSender.cutHeldUntil[name].map { t < $0 } ?? false
        while !cutHeld, st.wantsBatch(now: t), pixelSender.schedule.hasRoom, cuts < PixelSender.cutsPerRound {
            cuts += 1
            st.noteCut(now: t)
            let key = System.randomHex(16)
            do {
                let (n, bytes) = try store.cutBatch(
                    stream: name, key: key, maxCount: 1, maxBytes: st.settings.maxBatchBytes, final: false, nowMs: System.wallClockMs())
                st.cut(batch: key, count: n, bytes: bytes)
                streams[name] = st
                if n == 0 { break }
            } catch {
                plugin.log.error("cannot cut a batch", ["stream": name, "error": "\(error)"])
                pixelSender.cutHeldUntil[name] = t + StreamState.storeErrorRetryMs
                break
            }
            registerPixel(name, key, hosts: hosts)
            guard let s = streams[name] else { return }
            st = s
        }
        if cuts == PixelSender.cutsPerRound, st.wantsBatch(now: t) {
            plugin.loop.nextTurn { [unowned self] in
                self.pump(name, now: self.now)
                self.armWake()
            }
        }
        for px in pixelSender.schedule.next(now: t) {
            guard let s = streams[px.stream], let h = s.settings.getHosts else { continue }
            sendPixel(stream: px.stream, key: px.key, hosts: h)
        }
        if let s = streams[name] { answerDrainWaiters(name, s) }
    }

    /// Reads pixel batch `key`'s record and adds it to its lane (its owner: `data.owner`, else the
    /// stream's; its destination: the URL's host and port). A record whose URL is no longer
    /// allowed is set aside at once.
    /// False when the batch could not be read: it stays pending, and the stream's next turn
    /// looks through its pending pixels again.
    @discardableResult
    private func registerPixel(_ stream: String, _ key: String, hosts: Set<String>) -> Bool {
        let body: (body: [UInt8], count: Int, recordBytes: Int)
        do {
            body = try store.batchBody(key, stream: stream)
        } catch {
            pixelSender.scanned.remove(stream)
            plugin.log.error("cannot load batch", ["batch": key, "error": "\(error)"])
            return false
        }
        guard body.count > 0 else {
            dropEmptyBatch(stream, key)
            return true
        }
        let record = Uploader.pixelRecord(body.body)
        switch EndpointRule.parse(record.url, allowedHosts: hosts) {
        case .success(let target):
            let owner =
                record.owner.map { String(decoding: $0.utf8.prefix(PixelScheduler.maxOwnerBytes), as: UTF8.self) } ?? streams[stream]?
                .owner?.description ?? ""
            pixelSender.schedule.add(key, lane: PixelScheduler.Lane(stream: stream, owner: owner, destination: target.destination))
        case .failure(let why):
            // Allowed at the enqueue, not any more (the operator changed allowedHosts).
            let sent = StreamState.SentBatch(key: key, count: body.count, bytes: body.recordBytes, final: false)
            finished(stream: stream, endpoint: "", batch: sent, outcome: .rejected(status: 0, reason: why.description))
        }
        return true
    }

    /// The URL and the owner label of a pixel batch's one record.
    static func pixelRecord(_ body: [UInt8]) -> (url: String, owner: String?) {
        let record = (try? body.withUnsafeBytes { try JSONRef.parse($0, maxDepth: Plugin.maxDepth + 2) })?.json["records"]?.arrayValue?
            .first
        return (record?["data"]?["url"]?.stringValue ?? "", record?["data"]?["owner"]?.stringValue)
    }

    /// Requests pixel batch `key`'s URL (checked again against the hosts in effect now), then
    /// reports the outcome to the lanes and as a batch's (`finished`). A final batch (its switch
    /// was denied) is purged without the request.
    func sendPixel(stream: String, key: String, hosts: Set<String>) {
        let body: (body: [UInt8], count: Int, recordBytes: Int)
        let final: Bool
        do {
            body = try store.batchBody(key, stream: stream)
            final = try store.isFinal(key)
        } catch {
            pixelSender.schedule.localFailure(key, now: now, delayMs: StreamState.storeErrorRetryMs)
            batchLoadFailed(stream, key, error)
            return
        }
        guard body.count > 0 else {
            _ = pixelSender.schedule.finished(key, status: nil, .delivered, now: now, retry: retry, random: 0)
            dropEmptyBatch(stream, key)
            return
        }
        let sent = StreamState.SentBatch(key: key, count: body.count, bytes: body.recordBytes, final: final)
        if final {
            pixelFinished(stream, sent, destination: "", status: nil, .retry(reason: "consent denied; not requested", retryAfterMs: nil))
            return
        }
        let url = Uploader.pixelRecord(body.body).url
        let target: EndpointRule.Target
        switch EndpointRule.parse(url, allowedHosts: hosts) {
        case .success(let t): target = t
        case .failure(let why):
            pixelFinished(stream, sent, destination: "", status: nil, .rejected(status: 0, reason: why.description))
            return
        }
        let req = HTTPRequest(method: "GET", url: url, timeoutMs: limits.requestTimeoutMs)
        http.send(req) { [unowned self] r in
            switch r {
            case .success(let resp):
                let outcome = UploadOutcome.classifyGet(status: resp.status, retryAfterMs: resp.retryAfterMs, error: nil)
                self.pixelFinished(stream, sent, destination: target.destination, status: resp.status, outcome)
            case .failure(let e):
                let outcome = UploadOutcome.classifyGet(status: nil, retryAfterMs: nil, error: e.description)
                self.pixelFinished(stream, sent, destination: target.destination, status: nil, outcome)
            }
        }
    }

    /// A pixel's request came back (or was settled without one): the lanes decide (retry in the
    /// lane, or give up after `pixels.maxAttempts`), then the batch is disposed of as any
    /// batch's (`finished`: delete, keep, dead-letter; counters and the disk cap).
    private func pixelFinished(_ stream: String, _ sent: StreamState.SentBatch, destination: String, status: Int?, _ outcome: UploadOutcome)
    {
        let decision = pixelSender.schedule.finished(
            sent.key, status: status, outcome, now: now, retry: retry, random: Double.random(in: 0..<1))
        // A final batch leaves the lanes whatever the answer: its one send is done.
        if sent.final { pixelSender.schedule.remove(sent.key) }
        let result: UploadOutcome
        switch decision {
        case .delivered: result = .delivered
        case .retry(let reason, _, _): result = .retry(reason: reason, retryAfterMs: nil)
        case .deadLetter(let s, let reason): result = sent.final ? outcome : .rejected(status: s, reason: reason)
        }
        finished(stream: stream, endpoint: "get:" + destination, batch: sent, outcome: result)
        if case .retry(_, let delay, _) = decision, !sent.final { streams[stream]?.lastRetryDelayMs = delay }
    }

    /// A GET stream's `uploader.status` entry with its lanes: `inFlight` (requests now),
    /// `pixels {scheduled, lanes, waitingLanes}` (pixels handed to the lanes, lanes, lanes waiting
    /// after a failure) and `pixelLimits` (the `pixels` settings).
    func pixelStatus(_ entry: JSONObject, _ stream: String, now t: UInt64) -> JSONObject {
        var e = entry
        let s = pixelSender.schedule.summary(stream: stream, now: t)
        let l = pixelSender.schedule.limits
        e["inFlight"] = .int(Int64(s.inFlight))
        e["pixels"] = [
            "scheduled": .int(Int64(s.scheduled)), "lanes": .int(Int64(s.lanes)), "waitingLanes": .int(Int64(s.waitingLanes)),
        ]
        e["pixelLimits"] = [
            "maxInFlight": .int(Int64(l.maxInFlight)), "maxInFlightPerHost": .int(Int64(l.maxInFlightPerHost)),
            "maxAttempts": .int(Int64(l.maxAttempts)), "maxScheduled": .int(Int64(l.maxScheduled)),
        ]
        return e
    }

    /// The earliest time a GET stream needs a look with nothing else happening: a lane's wait
    /// ending, or queued records reaching their interval while the lanes have room.
    func pixelWake(now t: UInt64) -> UInt64? {
        var next = pixelSender.schedule.nextWake(now: t)
        guard pixelSender.schedule.hasRoom else { return next }
        for (name, st) in streams where st.settings.getHosts != nil && st.queued > 0 {
            // The queue's own timing only: the pending pixels are the lanes', and a failed
            // pixel's backoff is its lane's, not the stream's.
            var q = st
            q.pendingBatches = []
            q.inFlight = false
            q.notBeforeMs = pixelSender.cutHeldUntil[name] ?? 0
            if let w = q.nextWake(now: t) { next = min(next ?? w, w) }
        }
        return next
    }
}
