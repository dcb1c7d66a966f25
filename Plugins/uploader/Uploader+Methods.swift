import PylonPluginKit

/// The uploader's methods besides `enqueue`. Who may see and do what:
/// - a stream's owner or an admin may flush it, configure it and read its dead letters;
/// - `status` shows per-stream detail only for the streams the caller may use (an admin: all),
///   the caller's own quota usage, and the queue's totals;
/// - without a stream, `flush` and `deadLetters` cover only the caller's streams.
extension Uploader {
    /// Whether `caller` may use `stream` (without claiming it).
    func mayUse(_ stream: String, _ caller: Principal) -> Bool {
        if case .allowed = StreamAccess.decide(stream, owner: state(stream).owner, caller: caller, action: "use", claims: false) {
            return true
        }
        return false
    }

    /// The check of a method naming one stream; answers the refusal itself.
    func permit(_ call: Call, _ stream: String, _ action: String) -> Bool {
        switch StreamAccess.decide(
            stream, owner: state(stream).owner, caller: Principal(caller: call.callerInfo), action: action, claims: false)
        {
        case .allowed: return true
        case .refused(let e):
            call.fail(e)
            return false
        }
    }

    /// What a waiting flush's streams delivered and set aside since the flush: totals, and the
    /// records set aside per stream (only streams that set some aside).
    func drainReport(_ w: DrainWaiter) -> (delivered: UInt64, setAside: UInt64, byStream: JSONObject) {
        var delivered: UInt64 = 0
        var setAside: UInt64 = 0
        var byStream = JSONObject()
        for (name, b) in w.base {
            guard let st = streams[name] else { continue }
            delivered += st.delivered - min(st.delivered, b.delivered)
            let n = st.setAside - min(st.setAside, b.setAside)
            setAside += n
            if n > 0 { byStream[name] = .int(Int64(n)) }
        }
        return (delivered, setAside, byStream)
    }

    /// Answers flush waiters whose streams are all drained.
    func answerMultiDrainWaiters() {
        guard !multiDrainWaiters.isEmpty else { return }
        var keep: [DrainWaiter] = []
        for w in multiDrainWaiters {
            guard w.base.keys.allSatisfy({ streams[$0]?.isDrained ?? true }) else {
                keep.append(w)
                continue
            }
            let r = drainReport(w)
            w.call.reply([
                "drained": true, "delivered": .int(Int64(r.delivered)), "deadLettered": .int(Int64(r.setAside)),
                "deadLetteredByStream": .object(r.byStream),
            ])
        }
        multiDrainWaiters = keep
    }

    func answerDrainWaiters(_ stream: String, _ st: StreamState) {
        answerMultiDrainWaiters()
        guard st.isDrained, let waiters = drainWaiters.removeValue(forKey: stream) else { return }
        for w in waiters {
            let r = drainReport(w)
            w.call.reply([
                "stream": .string(stream), "drained": true, "lastResult": .string(st.lastResult),
                "delivered": .int(Int64(r.delivered)), "deadLettered": .int(Int64(r.setAside)),
                "deadLetters": .int(Int64(st.deadLetters)),
            ])
        }
    }

    /// `{stream?, wait?}`: upload now (skipping a retry wait). Without a stream: every stream the
    /// caller may use.
    func flush(_ call: Call) {
        commit()
        let caller = Principal(caller: call.callerInfo)
        let names: [String]
        let one: String?
        switch call.params["stream"] {
        case nil, .null?: one = nil
        case .string(let s)?: one = s
        default:
            call.fail(RPCError(.invalidParams, "params.stream must be a string (or absent: every stream the caller may use)"))
            return
        }
        if let s = one {
            guard Uploader.validStream(s) else {
                call.fail(RPCError(.invalidParams, "params.stream must be 1-128 of [A-Za-z0-9._:-]"))
                return
            }
            guard permit(call, s, "flush") else { return }
            names = [s]
        } else {
            names = streams.keys.filter { mayUse($0, caller) }
        }
        for n in names {
            var st = state(n)
            // A flush also skips a pending retry wait: the caller asked for "now".
            st.flush()
            streams[n] = st
            if st.settings.getHosts != nil { pixelSender.schedule.flush(stream: n) }
        }
        let wait = call.params["wait"]?.boolValue ?? false
        if wait {
            var base: [String: (delivered: UInt64, setAside: UInt64)] = [:]
            for n in names { base[n] = (streams[n]?.delivered ?? 0, streams[n]?.setAside ?? 0) }
            let w = DrainWaiter(call: call, base: base)
            if let s = one {
                drainWaiters[s, default: []].append(w)
            } else {
                multiDrainWaiters.append(w)
                answerMultiDrainWaiters()
            }
        } else {
            call.reply(["flushing": .array(names.sorted().map { .string($0) })])
        }
        pumpAll()
    }

    /// Per stream the caller may use: its queue, last result and settings; the caller's usage of
    /// its quotas (`owner`); the queue's totals; for an admin every owner's usage.
    func status(_ call: Call) {
        let caller = Principal(caller: call.callerInfo)
        var o = JSONObject()
        let t = now
        for name in streams.keys.sorted() where mayUse(name, caller) {
            let st = streams[name]!
            o[name] = [
                "owner": st.owner.map { .string($0.description) } ?? .null, "consent": .string(st.consentKey),
                "queued": .int(Int64(st.queued)), "queuedBytes": .int(Int64(st.queuedBytes)),
                "diskBytes": .int(Int64(st.diskBytes + st.deadLetterBytes)),
                "oldestAgeMs": st.oldestMs.map { .int(Int64(t - min(t, $0))) } ?? .null,
                "inFlight": .int(st.inFlight ? 1 : 0), "pendingBatches": .int(Int64(st.pendingBatches.count)),
                "lastResult": .string(st.lastResult), "retryDelayMs": .int(Int64(st.lastRetryDelayMs)),
                "retryInMs": .int(Int64(st.notBeforeMs > t ? st.notBeforeMs - t : 0)),
                "attempts": .int(Int64(st.attempts)),
                "lastCutTrigger": .string(st.lastCutTrigger), "lastCutOldestAgeMs": .int(Int64(st.lastCutOldestAgeMs)),
                "delivered": .int(Int64(st.delivered)), "deadLetters": .int(Int64(st.deadLetters)),
                "deadLetterBytes": .int(Int64(st.deadLetterBytes)), "setAside": .int(Int64(st.setAside)),
                "refusedConsent": .int(Int64(st.refusedConsent)),
                "maxCount": .int(Int64(st.settings.maxCount)), "intervalMs": .int(Int64(st.settings.intervalMs)),
                "maxBatchBytes": .int(Int64(st.settings.maxBatchBytes)), "endpoint": .string(st.settings.endpoint),
                "delivery": st.settings.getHosts == nil ? "post" : "get",
            ]
            if st.settings.getHosts != nil, let entry = o[name]?.objectValue { o[name] = .object(pixelStatus(entry, name, now: t)) }
        }
        var r: JSONObject = [
            "streams": .object(o), "diskBytes": .int(Int64(diskBytes)), "maxDiskBytes": .int(Int64(limits.maxDiskBytes)),
            "fsync": fsyncFull ? "full" : "normal", "commits": .int(Int64(commits)),
            "pendingDeletes": .int(Int64(store.deliveredQueue.count)),
            "ownerChanges": .int(Int64(ownerChanges)),
            // Segment files set aside as unreadable (docs/UPLOADER.md "Quarantine").
            "quarantinedFiles": .int(Int64(store.log.quarantinedFiles.count)),
            "quarantined": .array(store.log.quarantinedFiles.prefix(Uploader.maxQuarantinedNamesShown).map { .string($0) }),
        ]
        if let me = caller.identity { r["owner"] = usage(me) }
        if caller.isAdmin {
            var u = JSONObject()
            for w in ledger.owners.keys.sorted(by: { $0.description < $1.description }) { u[w.description] = usage(w) }
            r["owners"] = .object(u)
        }
        call.reply(.object(r))
    }

    func usage(_ o: StreamOwner) -> JSON {
        let u = ledger.usage(o)
        return [
            "owner": .string(o.description), "diskBytes": .int(Int64(u.bytes)),
            "maxDiskBytesPerOwner": .int(Int64(limits.diskBytes(for: o))),
            "streams": .int(Int64(u.streams)), "maxStreamsPerOwner": .int(Int64(limits.streams(for: o))),
        ]
    }

    /// `{stream, maxCount?, intervalMs?, maxBatchBytes?}`: MA's setMaxEventCacheCount and
    /// setReportInterval land here. The stream's owner or an admin only (configuring a stream
    /// nobody owns makes the caller its owner). `maxCount` and `intervalMs` are persisted.
    /// Endpoints are operator configuration: `endpoint` is refused.
    func configureStream(_ call: Call) {
        let p = call.params
        guard let name = p["stream"]?.stringValue, Uploader.validStream(name) else {
            call.fail(RPCError(.invalidParams, "params.stream is required"))
            return
        }
        if p["endpoint"] != nil {
            call.fail(
                RPCError(
                    .invalidParams,
                    "endpoint is operator configuration (plugins[uploader].config endpoint or streams[pattern].endpoint); it cannot be set by a call",
                    data: ["param": "endpoint"]))
            return
        }
        var st = state(name)
        let owner: StreamOwner
        switch StreamAccess.decide(name, owner: st.owner, caller: Principal(caller: call.callerInfo), action: "configure", claims: true) {
        case .refused(let e): call.fail(e); return
        case .allowed(let o?, _): owner = o
        case .allowed(nil, _): call.fail(RPCError(.notPermitted, "stream \(name) has no owner")); return
        }
        // null restores the configured default (MA's report interval lasts one app session).
        let configured = config.catalog.settings(for: name, defaultEndpoint: config.defaultEndpoint)
        /// The param as an integer within `range` (nil: absent or null), or nil after answering
        /// the -32602 that names it and its bounds.
        func bounded(_ key: String, _ range: ClosedRange<Int64>) -> Int64?? {
            guard let v = p[key], v != .null else { return .some(nil) }
            guard let n = v.intValue, range.contains(n) else {
                call.fail(
                    RPCError(
                        .invalidParams, "\(key) must be an integer from \(range.lowerBound) to \(range.upperBound)",
                        data: ["param": .string(key), "min": .int(range.lowerBound), "max": .int(range.upperBound)]))
                return nil
            }
            return .some(n)
        }
        guard let maxCount = bounded("maxCount", StreamSettings.maxCountRange),
            let intervalMs = bounded("intervalMs", StreamSettings.intervalMsRange),
            let maxBatchBytes = bounded("maxBatchBytes", StreamSettings.maxBatchBytesRange)
        else { return }
        if p["maxCount"] == JSON.null { st.settings.maxCount = configured.maxCount }
        if p["intervalMs"] == JSON.null { st.settings.intervalMs = configured.intervalMs }
        if p["maxBatchBytes"] == JSON.null { st.settings.maxBatchBytes = configured.maxBatchBytes }
        if let v = maxCount { st.settings.maxCount = Int(v) }
        if let v = intervalMs { st.settings.intervalMs = UInt64(v) }
        if let v = maxBatchBytes { st.settings.maxBatchBytes = Int(v) }
        if recordedOwners[name] == nil {
            if let e = ledger.admit(owner, bytes: 0, newStream: true, totalBytes: 0, limits: limits) {
                call.fail(e)
                return
            }
            guard register(name, owner: owner) else {
                call.fail(RPCError(.internalError, "could not record the owner of stream \(name)"))
                return
            }
            st.owner = state(name).owner
        }
        do {
            try store.saveSettings(stream: name, maxCount: st.settings.maxCount, intervalMs: st.settings.intervalMs)
        } catch {
            call.fail(RPCError(.internalError, "\(error)"))
            return
        }
        streams[name] = st
        call.reply([
            "stream": .string(name), "maxCount": .int(Int64(st.settings.maxCount)),
            "intervalMs": .int(Int64(st.settings.intervalMs)), "endpoint": .string(st.settings.endpoint),
        ])
        pump(name, now: now)
        armWake()
    }
}
