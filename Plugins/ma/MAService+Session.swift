import PylonPluginKit

/// Upload cadence and app sessions (docs/MA.md, `ma.setReportInterval` and "Events and sessions"): `ma.setReportInterval`,
/// `ma.setMaxEventCacheCount`, `ma.setSessionTimeout`, `ma.setAppState`; the session events
/// `el_session_start`/`el_session_end`; a client that disconnects counts as background.
extension MAService {
    func setReportInterval(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let s = call.params["interval"]?.intValue, s > 0, s <= Self.maxReportIntervalS else {
            call.reply(Self.result(MACode.invalidParams, "interval (seconds, 1 to \(Self.maxReportIntervalS)) is required"))
            return
        }
        configureStream(inst, ["intervalMs": .int(s * 1000)]) { [unowned self] e in
            if let e { call.reply(Self.result(MACode.failed, e.message)); return }
            // Held for the app's session (docs/MA.md, `ma.setReportInterval`): undone when its last client disconnects —
            // at once if that happened while this call was in flight.
            inst.reportIntervalS = s
            self.persist(inst)
            if call.callerInfo.client != nil, !self.sessionActive(inst.appKey) { self.endReportInterval(inst) }
            call.reply(Self.result(0, ""))
        }
    }

    /// The uploader's batch size for an AppKey's events is never set above this.
    static let maxEventCacheCount: Int64 = 500

    func setMaxEventCacheCount(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let n = call.params["count"]?.intValue, n > 0 else {
            call.reply(Self.result(MACode.invalidParams, "count (> 0) is required"))
            return
        }
        let count = min(n, Self.maxEventCacheCount)
        configureStream(inst, ["maxCount": .int(count)]) { e in
            call.reply(e.map { Self.result(MACode.failed, $0.message) } ?? Self.result(0, "", ["count": .int(count)]))
        }
    }

    func setSessionTimeout(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let s = call.params["interval"]?.intValue, s > 0, s <= Self.maxSessionTimeoutS else {
            call.reply(Self.result(MACode.invalidParams, "interval (seconds, 1 to \(Self.maxSessionTimeoutS)) is required"))
            return
        }
        inst.sessionTimeoutS = s
        persist(inst)
        call.reply(Self.result(0, ""))
    }

    func setAppState(_ call: Call) {
        guard let inst = usable(call) else { return }
        switch call.params["state"]?.stringValue {
        case "background": setBackground(inst, true)
        case "foreground": setBackground(inst, false)
        default:
            call.reply(Self.result(MACode.invalidParams, "state must be \"foreground\" or \"background\""))
            return
        }
        call.reply(Self.result(0, ""))
    }

    // MARK: Client connections

    func clientClosed(_ client: Int64) {
        var keys = liveClients.removeValue(forKey: client) ?? []
        if let k = clientAppKey.removeValue(forKey: client) {
            keys.insert(k)
            try? db.run("DELETE FROM bindings WHERE client=?", [.int(client)])
        }
        // A client that disconnects counts as the app going to the background; its session's
        // report interval ends with it (the uploader falls back to the configured default).
        for k in keys.sorted() where !sessionActive(k) {
            guard let inst = instances[k] else { continue }
            setBackground(inst, true)
            endReportInterval(inst)
        }
    }

    /// Undoes `ma.setReportInterval` for `inst` (its app session is over).
    func endReportInterval(_ inst: MAInstance) {
        if inst.reportIntervalS != nil {
            inst.reportIntervalS = nil
            persist(inst)
            configureStream(inst, ["intervalMs": .null]) { [unowned self] e in
                if let e { self.plugin.log.warn("cannot reset the report interval", ["appKey": inst.appKey, "error": e.message]) }
            }
        }
    }

    /// Sets fields of the instance's uploader stream (`uploader.configureStream`).
    func configureStream(_ inst: MAInstance, _ fields: JSONObject, _ done: @escaping (RPCError?) -> Void) {
        var p = fields
        p["stream"] = .string(inst.stream)
        plugin.call("uploader.configureStream", .object(p)) { r in
            if case .failure(let e) = r { done(e) } else { done(nil) }
        }
    }

    // MARK: Sessions

    func touchSession(_ inst: MAInstance) {
        perform(inst, inst.session.touch(now: plugin.loop.nowMs, timeoutMs: inst.sessionTimeoutMs) { System.randomHex(8) })
    }

    func setBackground(_ inst: MAInstance, _ bg: Bool) {
        perform(inst, inst.session.setBackground(bg, now: plugin.loop.nowMs, timeoutMs: inst.sessionTimeoutMs))
    }

    /// After a restart (`MASession.restored`).
    func restoreSession(_ inst: MAInstance) {
        perform(inst, inst.session.restored(now: plugin.loop.nowMs, timeoutMs: inst.sessionTimeoutMs))
    }

    /// Performs the session machine's effects in order: the session events (a restart continues
    /// a persisted session), persisting, and the instance's one timer (libuv re-arms an active one).
    func perform(_ inst: MAInstance, _ effects: [MASession.Effect]) {
        for e in effects {
            switch e {
            case .started(let id): recordOwn(inst, "el_session_start", session: id)
            case .ended(let id): recordOwn(inst, "el_session_end", session: id)
            case .persist: persist(inst)
            case .arm(let at):
                let t =
                    inst.sessionTimer
                    ?? Timer(loop: plugin.loop) { [unowned self, unowned inst] in
                        self.perform(inst, inst.session.timerFired(now: self.plugin.loop.nowMs))
                    }
                inst.sessionTimer = t
                let now = plugin.loop.nowMs
                t.start(after: at > now ? at - now : 1)
            case .cancel: inst.sessionTimer?.stop()
            }
        }
    }
}
