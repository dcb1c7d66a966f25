import PylonPluginKit
import PylonStore

/// Receiving from the broker, delivering to attached apps, acknowledgements.
extension PushService {
    /// Fields a message may carry; others are counted (`unknownFields`) and not passed on.
    static let knownFields: Set<String> = [
        "id", "appId", "title", "content", "extras", "action", "silent", "expiresAt", "sentAt", "msgKey", "liveActivity",
    ]

    /// One MQTT message (inside the read batch's transaction). Never throws, never crashes:
    /// anything unusable is counted and logged.
    func received(topic: String, _ payload: UnsafeRawBufferPointer) {
        counters.received += 1
        guard payload.count <= config.maxPayloadBytes else {
            malformed("payload of \(payload.count) bytes exceeds maxPayloadBytes \(config.maxPayloadBytes)")
            return
        }
        guard let parsed = try? tokener.parse(payload), case .object(var o) = parsed.json else {
            malformed("payload is not a JSON object")
            return
        }
        guard let id = o["id"]?.stringValue, id.isValidPushId, let appId = o["appId"]?.stringValue, appId.isValidPushId else {
            malformed("id or appId missing or invalid")
            return
        }
        for k in o.keys where !PushService.knownFields.contains(k) {
            counters.unknownFields += 1
            log.debug("unknown message field dropped", ["id": id, "field": k])
            o[k] = nil
        }
        // An integer (not a fraction, not a whole number written as one).
        let expiresAt: Int64
        if case .int(let e)? = o["expiresAt"] { expiresAt = e } else { expiresAt = Int64.max / 2 }
        var targetApp = appId
        if let la = o["liveActivity"], la != .null {
            guard let aid = la["activityId"]?.stringValue, let ev = la["event"]?.stringValue, ev == "update" || ev == "end" else {
                malformed("liveActivity without activityId or a known event")
                return
            }
            if let b = activities.bound[aid] {
                targetApp = b.appId
                if let schema = b.schema, let why = LiveActivities.mismatch(la["contentState"], schema) {
                    counters.schemaMismatch += 1
                    log.warn(
                        "live activity push does not match the declared schema: not delivered",
                        ["id": id, "activityId": aid, "why": why])
                    return
                }
                if targetApp != appId { o["appId"] = .string(targetApp) }
            }
        }
        var keys = ["id:" + id]
        if let k = o["msgKey"]?.stringValue { keys.append("key:" + k) }
        do throws(IOError) {
            guard try inbox.markSeen(appId: targetApp, keys: keys) else {
                counters.duplicates += 1
                log.debug("duplicate dropped", ["id": id, "appId": targetApp])
                // A repeat of a message this device no longer holds (acknowledged, expired or
                // dropped) is reported done again: the first report may have been lost (a broker
                // cluster drops an ack published while the backend's subscription is re-created;
                // the backend republishes what it has no report for).
                if delivery.entries[id] == nil, !pendingAcks.contains(id), pendingAcks.count < config.maxPendingAckReports {
                    pendingAcks.append(id)
                    if !ackFlush.isActive { ackFlush.start(after: 0) }
                }
                return
            }
            seq += 1
            let text = JSON.object(o).serialized
            let n = text.utf8.count
            let actions = delivery.received(id: id, appId: targetApp, seq: seq, bytes: n, expiresAt: expiresAt, now: now)
            if !actions.contains(.discard(id: id, reason: .expired)) {
                try inbox.insert(
                    .init(id: id, appId: targetApp, seq: seq, payload: text, expiresAt: expiresAt, cold: attached[targetApp] == nil))
            }
            perform(actions)
        } catch {
            // libmosquitto acknowledged the message before this callback ran, so the broker does
            // not send it again: it is lost (disk full or I/O error). Said as it is.
            log.error(
                "cannot store a message; it is lost (the broker already has its acknowledgement)", ["id": id, "error": error.description])
        }
        arm()
    }

    private func malformed(_ why: String) {
        counters.malformed += 1
        log.warn("malformed push message dropped", ["why": why])
    }

    func perform(_ actions: [Delivery.Action]) {
        for a in actions {
            switch a {
            case .deliver(let id, let appId, let client, let cold, _):
                deliver(id: id, appId: appId, client: client, coldStart: cold)
            case .acked(let id, _):
                // Deleted with the other acks of this loop turn, in one transaction (flushAcks).
                pendingAcks.append(id)
                if pendingAcks.count > config.maxPendingAckReports {
                    pendingAcks.removeFirst(pendingAcks.count - config.maxPendingAckReports)
                }
                pendingDeletes.append(id)
                if pendingDeletes.count == 1 { ackFlush.start(after: 0) }
            case .discard(let id, let reason):
                try? inbox.remove([id])
                log.info("message discarded", ["id": id, "reason": reason.rawValue])
            }
        }
    }

    /// Calls the app's callback on the client that attached it (the host routes a provided
    /// method to its one provider; attach checked that provider is the attaching client).
    private func deliver(id: String, appId: String, client: Int64, coldStart: Bool) {
        guard let a = attached[appId], a.client == client, let text = inbox.payload(id) else {
            perform(delivery.callbackResult(id: id, ok: false, now: now))
            return
        }
        // `{"message":<the stored message>,"coldStart":<bool>}`, written as text: the message was
        // stored as JSON text (printed from its parsed value), so it is sent as it is.
        var params = Array(#"{"message":"#.utf8)
        params.append(contentsOf: text.utf8)
        params.append(contentsOf: (coldStart ? #","coldStart":true}"# : #","coldStart":false}"#).utf8)
        params.withUnsafeBytes { p in callback(a.callback, p, id: id, appId: appId) }
    }

    /// The callback call of `deliver`, with its params' text.
    private func callback(_ callback: String, _ params: UnsafeRawBufferPointer, id: String, appId: String) {
        plugin.call(
            callback, .text(params),
            answer: .text { [unowned self] r in
                let ok: Bool
                switch r {
                case .success: ok = true
                case .failure(let e):
                    ok = false
                    self.log.info("delivery not acknowledged", ["id": id, "appId": appId, "error": e.message])
                }
                self.perform(self.delivery.callbackResult(id: id, ok: ok, now: self.now))
                self.arm()
            })
    }

    /// After connecting (the subscription is sent first): asks the backend to publish again what
    /// this device has not acknowledged, in case the broker lost it (duplicates are dropped by id).
    func hello() {
        guard let device = deviceId, let mqtt, mqtt.state == .connected else { return }
        mqtt.publish("pylon/push/ack/" + device, Array(#"{"ids":[],"hello":true}"#.utf8), qos: 1)
    }

    /// Reports acknowledged ids to the backend (QoS 1 on the device's ack topic).
    func flushAcks() {
        if !pendingDeletes.isEmpty {
            do throws(IOError) { try inbox.remove(pendingDeletes) } catch {
                log.error("cannot record acknowledgements in the inbox; delivered again after a restart", ["error": error.description])
            }
            pendingDeletes.removeAll(keepingCapacity: true)
        }
        guard !pendingAcks.isEmpty, let device = deviceId, let mqtt, mqtt.state == .connected else { return }
        let ids = pendingAcks
        pendingAcks = []
        let body = JSON.object(["ids": .array(ids.map { .string($0) })]).serialized
        mqtt.publish("pylon/push/ack/" + device, Array(body.utf8), qos: 1)
    }

    // MARK: Attach / detach

    func attach(_ call: Call) {
        guard let appId = call.params["appId"]?.stringValue, appId.isValidPushId else {
            call.reply(reply(PushCode.invalidParams, "appId must be 1-128 of [A-Za-z0-9._-]"))
            return
        }
        guard let cb = call.params["callback"]?.stringValue, cb.contains("."), !cb.hasSuffix("."), cb.utf8.count <= 256,
            !cb.hasPrefix("push.")
        else {
            call.reply(reply(PushCode.invalidParams, "callback must be a method name this client provides (bus.provide)"))
            return
        }
        guard let client = call.callerInfo.client, let uid = call.callerInfo.uid else {
            call.reply(reply(PushCode.notPermitted, "push.attach is for clients"))
            return
        }
        let owner = store.appOwner(appId)
        // The kit's rule (`Ownership.pushApps`); an admin does not take another uid's app by
        // attaching to it (the attachment records its uid): it hands the app over with
        // `push.setOwner` instead.
        switch Ownership.pushApps.access(owner.map { Owner.uid($0) }, caller: CallerInfo(uid: uid), claims: true) {
        case .owner, .claim: break
        case .admin, .unowned, .refused:
            call.reply(reply(PushCode.notPermitted, "appId \(appId) belongs to another user"))
            return
        }
        if let cur = attached[appId], cur.client != client {
            call.reply(reply(PushCode.notPermitted, "appId \(appId) is attached by another client"))
            return
        }
        if owner == nil, (store.attachmentsCount()) >= config.maxApps {
            call.reply(reply(PushCode.limit, "too many apps (maxApps \(config.maxApps))"))
            return
        }
        providers { [unowned self] provided in
            guard provided[cb] == client else {
                call.reply(self.reply(PushCode.notPermitted, "callback \(cb) is not provided by this client"))
                return
            }
            if let cur = self.attached[appId], cur.client != client {
                call.reply(self.reply(PushCode.notPermitted, "appId \(appId) is attached by another client"))
                return
            }
            do throws(SQLiteError) {
                try self.store.setApp(appId, uid: uid, client: client, callback: cb)
            } catch {
                call.reply(self.reply(PushCode.limit, "cannot record the attachment: \(error.description)"))
                return
            }
            self.attached[appId] = Attachment(client: client, uid: uid, callback: cb)
            let pending = self.delivery.entries.values.filter { $0.appId == appId }.count
            call.reply(self.reply(PushCode.ok, "", ["pending": .int(Int64(pending))]))
            self.perform(self.delivery.attach(appId: appId, client: client, now: self.now))
            self.arm()
        }
    }

    func detach(_ call: Call) {
        guard let appId = call.params["appId"]?.stringValue, let a = attached[appId] else {
            call.reply(reply(PushCode.invalidParams, "appId is not attached"))
            return
        }
        guard a.client == call.callerInfo.client else {
            call.reply(reply(PushCode.notPermitted, "appId \(appId) is attached by another client"))
            return
        }
        detachApp(appId)
        call.reply(reply(PushCode.ok, ""))
    }

    func detachApp(_ appId: String) {
        guard let a = attached.removeValue(forKey: appId) else { return }
        try? store.setApp(appId, uid: a.uid, client: nil, callback: nil)
        delivery.detach(appId: appId)
    }

    func clientClosed(_ client: Int64) {
        for (app, a) in attached where a.client == client { detachApp(app) }
        arm()
    }

    func reply(_ code: Int64, _ message: String, _ extra: JSONObject = [:]) -> JSON {
        var o: JSONObject = ["code": .int(code), "message": .string(message)]
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }
}

extension PushStore {
    func attachmentsCount() -> Int { Int((try? db.query("SELECT count(*) FROM apps"))?.first?.first?.int ?? 0) }
}
