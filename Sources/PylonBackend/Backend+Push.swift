import PylonCore
import PylonMQTT
import PylonStore

/// The push API: push-token registration, user and Live Activity bindings (device side, each
/// with the calling device's own token), the admin send API that publishes to the broker with
/// QoS 1, and inspection. Wire topics, by the device id of `POST /v1/devices/register`:
/// `pylon/push/d/{deviceId}` carries a device's messages, `pylon/push/all` broadcasts,
/// `pylon/push/ack/{deviceId}` its apps' delivery acknowledgements (`{"ids": [msgId, ...]}`);
/// the broker lets each device read only its own topic and the broadcast one, and write only
/// its own ack topic (`Backend+Broker.swift`).
extension Backend {
    /// Push limits (named, answered with 400/413 when exceeded).
    enum PushLimits {
        static let maxIdBytes = 256
        static let maxTitleBytes = 1024
        static let maxContentBytes = 4096
        static let maxExtendedParams = 64
        /// The published message (JSON) may not exceed this; the plugin's own limit is the same.
        static let maxPayloadBytes = 16 * 1024
        static let maxExpiredSeconds: Int64 = 30 * 86400
        static let defaultExpiredSeconds: Int64 = 3 * 86400
        /// Unacknowledged sends published again when the backend reconnects to the broker (all
        /// devices) or a device says hello after connecting (that device), newest first.
        static let maxRepublish = 10_000
        static let maxRepublishPerDevice = 1000
    }

    static func deviceTopic(_ deviceId: String) -> String { "pylon/push/d/" + deviceId }
    /// The topic every device reads (at QoS 0): a broadcast is one publish here. Each device
    /// still acknowledges it on its own ack topic, and one that missed it (offline, or the
    /// broker lost it) gets it on its own topic when it says hello (`republish`).
    static let broadcastTopic = "pylon/push/all"
    static func ackTopic(_ deviceId: String) -> String { "pylon/push/ack/" + deviceId }
    static let ackTopicFilter = "pylon/push/ack/+"

    /// Connects the backend to the broker and records acknowledgements the devices publish.
    package func attachBroker(_ client: MQTTClient) {
        mqtt = client
        client.subscribe(Backend.ackTopicFilter, qos: 1)
        if dynsec { client.subscribe(Backend.dynsecResponseTopic, qos: 1) }
        client.onMessage = { [unowned self] topic, payload in
            if topic.hasPrefix(Backend.dynsecResponseTopic) {
                self.dynsecResponse(payload)
                return
            }
            guard topic.hasPrefix("pylon/push/ack/") else { return }
            let device = String(topic.dropFirst("pylon/push/ack/".count))
            guard let j = try? JSONRef.parse(payload, maxDepth: 8).json, let ids = j["ids"]?.arrayValue else {
                self.log.warn("push: malformed ack", ["deviceId": device])
                return
            }
            if j["hello"]?.boolValue == true { self.republish(deviceId: device) }
            let now = System.wallClockMs()
            for id in ids.compactMap(\.stringValue) { self.mark(.acked(msgId: id, deviceId: device, at: now)) }
        }
        // PUBACKs and acks read together are recorded in one transaction.
        client.onReadBatchBegin = { [unowned self] in self.marks.batching = true }
        client.onReadBatchEnd = { [unowned self] in
            self.marks.batching = false
            self.flushMarks()
        }
        client.onConnect = { [unowned self] _ in self.brokerConnected() }
        // Republish once acks can be heard: a clustered broker (nats-server) keeps no ack
        // published while this clean-session subscription is being re-created, and the device
        // reports a repeat of an acknowledged message done again.
        client.onSubscribed = { [unowned self] topic in
            if topic == Backend.ackTopicFilter { self.republish(deviceId: nil) }
        }
        client.start()
    }

    /// A delivery's state change, recorded with the others read at the same time.
    enum DeliveryMark {
        /// The device acknowledged `msgId` (its apps have it).
        case acked(msgId: String, deviceId: String, at: Int64)
        /// The broker acknowledged the publish of `msgId` to `token`'s device, or (nil) to the
        /// broadcast topic: every delivery of it.
        case puback(msgId: String, token: String?, at: Int64)
    }

    /// The marks not yet written, and whether a broker read is in progress (its marks are
    /// written together when it ends; at most one read's worth: `MQTTOptions.maxPacketsPerRead`).
    struct DeliveryMarks {
        var pending: [DeliveryMark] = []
        var batching = false
    }

    func mark(_ m: DeliveryMark) {
        marks.pending.append(m)
        if !marks.batching { flushMarks() }
    }

    /// Writes the pending marks in one transaction, run again on a conflict (two instances
    /// marking rows of one broadcast can deadlock: the loser's whole batch is retried, not left
    /// half-applied in an aborted transaction).
    func flushMarks() {
        guard !marks.pending.isEmpty else { return }
        let batch = marks.pending
        marks.pending = []
        do throws(StoreError) {
            try store.transaction(.readCommitted) { () throws(StoreError) in
                for m in batch {
                    switch m {
                    case .acked(let id, let device, let at): try store.pushMarkAcked(msgId: id, deviceId: device, now: at)
                    case .puback(let id, let token?, let at): try store.pushMark("puback_at", msgId: id, token: token, now: at)
                    case .puback(let id, nil, let at): try store.pushMarkAll("puback_at", msgId: id, now: at)
                    }
                }
            }
        } catch {
            log.error("push: delivery marks not stored", ["count": batch.count, "error": error.description])
        }
    }

    /// Publishes again every send its device has not acknowledged (not yet expired), with the
    /// same message id, so one the broker lost (mosquitto saves its queue only every
    /// `autosave_interval`: a kill -9 loses what it acknowledged since) still arrives; the device
    /// drops repeats by message id. Run when the backend's ack subscription is granted (after each (re)connect) and when a device reports
    /// `{"ids": [], "hello": true}` after connecting (its subscription is in place then).
    func republish(deviceId: String?) {
        guard let mqtt, mqtt.state == .connected else { return }
        let limit = deviceId == nil ? PushLimits.maxRepublish : PushLimits.maxRepublishPerDevice
        let rows: [(msgId: String, token: String, deviceId: String, payload: String)]
        do throws(StoreError) { rows = try store.pushUnacked(deviceId: deviceId, limit: limit) } catch {
            log.error("push: unacknowledged sends not read", ["error": error.description])
            return
        }
        let now = System.wallClockMs()
        var n = 0
        for r in rows {
            let bytes = Array(r.payload.utf8)
            let expiresAt = (try? JSON.parse(r.payload))?["expiresAt"]?.intValue ?? 0
            guard expiresAt > now else { continue }
            mqtt.publish(Backend.deviceTopic(r.deviceId), bytes, qos: 1, expirySeconds: UInt32(max(1, (expiresAt - now) / 1000)))
            n += 1
        }
        if n > 0 { log.info("push: republished unacknowledged sends", ["count": n, "deviceId": deviceId ?? "all"]) }
    }

    private func field(_ body: JSON, _ key: String) throws(APIError) -> String? {
        guard let v = body[key], !v.isNull else { return nil }
        guard let s = v.stringValue, s.utf8.count <= PushLimits.maxIdBytes, Router.invalidName(s, what: key) == nil || s.isEmpty else {
            throw .badRequest(
                .invalidRequest, "\(key) must be a string of at most \(PushLimits.maxIdBytes) bytes without control characters")
        }
        return s
    }

    /// `POST /v1/push/{register|bind|unbind|liveactivity}`: replies `{code, message}` with the
    /// service's codes (3012 no user id, 3001 no/unknown device token).
    ///
    /// The caller is a registered device (`Access.pushDevice`): it registers push tokens for its
    /// own install only, and binds users and Live Activities to its own active tokens only; a
    /// Live Activity bound by another device stays with that device (3003).
    func pushCall(_ request: HTTPRequest, _ call: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        guard case .device(_, let ownInstall) = principal else { throw .forbidden("push calls need a device token") }
        let body = try jsonBody(request)
        guard body.objectValue != nil else { throw .badRequest(.invalidRequest, "body must be a JSON object") }
        let now = System.wallClockMs()
        func reply(_ code: Int64, _ message: String, _ extra: JSONObject = [:]) -> HTTPResponse {
            var o: JSONObject = ["code": .int(code), "message": .string(message)]
            for (k, v) in extra { o[k] = v }
            return HTTPResponse(.object(o))
        }
        if call == "register" {
            let install = try field(body, "installId") ?? ownInstall
            guard install == ownInstall else { throw .forbidden("installId is not the calling device's") }
            let renew = body["renew"]?.boolValue ?? false
            let given = try field(body, "token")
            if let g = given,
                !(16...128).contains(g.utf8.count) || !g.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
            {
                throw .badRequest(.invalidRequest, "token must be 16 to 128 lowercase hex digits")
            }
            let r = try storage { () throws(StoreError) in
                try store.transaction { () throws(StoreError) in
                    try store.pushRegister(installId: install, renew: renew, given: given, now: now)
                }
            }
            log.info("push: registered", ["installId": install, "renewed": r.previous != nil])
            return reply(0, "", ["token": .string(r.token), "previous": r.previous.map { .string($0) } ?? .null])
        }
        guard let token = try field(body, "token"), !token.isEmpty,
            try storage({ () throws(StoreError) in try store.pushTokenBelongs(token, installId: ownInstall) })
        else {
            return reply(3001, "NEED_DELIVERYTOKEN")
        }
        switch call {
        case "bind", "unbind":
            guard let user = try field(body, "userId"), !user.isEmpty else { return reply(3012, "NEED_USERID") }
            if call == "bind" {
                let prev = try storage { () throws(StoreError) in
                    try store.transaction { () throws(StoreError) in try store.pushBind(token: token, userId: user, now: now) }
                }
                return reply(0, "", ["unbound": prev.map { .string($0) } ?? .null])
            }
            let removed = try storage { () throws(StoreError) in try store.pushUnbind(token: token, userId: user) }
            return reply(0, "", ["unbound": .bool(removed)])
        default:  // liveactivity
            guard let act = try field(body, "activityId"), !act.isEmpty, let pt = try field(body, "pushToken"), !pt.isEmpty,
                let app = try field(body, "appId"), !app.isEmpty
            else {
                return reply(3002, "activityId, pushToken and appId are required")
            }
            let taken = try storage { () throws(StoreError) in
                try store.transaction { () throws(StoreError) -> Bool in
                    if let holder = try store.pushActivityInstall(act), holder != ownInstall { return true }
                    try store.pushBindActivity(activityId: act, pushToken: pt, token: token, appId: app, now: now)
                    return false
                }
            }
            if taken { return reply(3003, "activity \(act) is bound to another device") }
            return reply(0, "")
        }
    }

    /// `POST /v1/admin/push/send`: resolves the target to devices and publishes one QoS 1 message
    /// per device. Replies `{msgId, devices, duplicate}`; 503 when the broker is not connected.
    func pushSend(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard body.objectValue != nil else { throw .badRequest(.invalidRequest, "body must be a JSON object") }
        guard let mqtt, mqtt.state == .connected else {
            throw APIError(status: 503, code: .invalidRequest, message: "the push broker is not connected", retryAfter: 1)
        }
        let targetType = body["targetType"]?.stringValue ?? "device"
        guard ["device", "user", "activity", "broadcast"].contains(targetType) else {
            throw .badRequest(.invalidRequest, "targetType must be device, user, activity or broadcast")
        }
        let target = try field(body, "target") ?? ""
        if targetType != "broadcast" && target.isEmpty { throw .badRequest(.invalidRequest, "target is required") }
        var appId = try field(body, "appId")
        let msgKey = try field(body, "msgKey")
        let now = System.wallClockMs()
        // Resolved again inside the recording transaction (`record` below), so the devices
        // published to are the ones recorded.
        let resolvedFirst = try storage { () throws(StoreError) in try store.pushResolve(targetType: targetType, target: target) }
        if targetType == "activity" { appId = appId ?? resolvedFirst.appId }
        guard let appId, !appId.isEmpty else { throw .badRequest(.invalidRequest, "appId is required") }
        if let k = msgKey,
            let existing = try storage({ () throws(StoreError) in
                try store.pushExistingSend(appId: appId, targetType: targetType, target: target, msgKey: k)
            })
        {
            return HTTPResponse(["msgId": .string(existing), "devices": 0, "duplicate": true])
        }
        let expired = body["expiredSeconds"]?.intValue ?? PushLimits.defaultExpiredSeconds
        guard (1...PushLimits.maxExpiredSeconds).contains(expired) else {
            throw .badRequest(.invalidRequest, "expiredSeconds must be 1...\(PushLimits.maxExpiredSeconds)")
        }
        let msgId = "m" + System.randomHex(12)
        var m: JSONObject = [
            "id": .string(msgId), "appId": .string(appId), "sentAt": .int(now),
            "expiresAt": .int(now + expired * 1000),
        ]
        for k in ["title", "content"] {
            if let v = body[k] {
                guard let s = v.stringValue, s.utf8.count <= (k == "title" ? PushLimits.maxTitleBytes : PushLimits.maxContentBytes) else {
                    throw .badRequest(.invalidRequest, "\(k) must be a string within its limit")
                }
                m[k] = .string(s)
            }
        }
        if let ep = body["extendedParams"] {
            guard let o = ep.objectValue, o.count <= PushLimits.maxExtendedParams, o.allSatisfy({ $0.value.stringValue != nil }) else {
                throw .badRequest(.invalidRequest, "extendedParams must be a map of at most \(PushLimits.maxExtendedParams) strings")
            }
            m["extras"] = ep
        }
        if let u = body["url"]?.stringValue { m["action"] = ["type": "url", "value": .string(u)] }
        if let u = body["uri"]?.stringValue { m["action"] = ["type": "uri", "value": .string(u)] }
        m["silent"] = .bool(body["silent"]?.boolValue ?? false)
        if let k = msgKey { m["msgKey"] = .string(k) }
        if targetType == "activity" || body["activityEvent"] != nil {
            let ev = body["activityEvent"]?.stringValue ?? "update"
            guard ev == "update" || ev == "end" else { throw .badRequest(.invalidRequest, "activityEvent must be update or end") }
            guard targetType == "activity" else { throw .badRequest(.invalidRequest, "activityEvent needs targetType activity") }
            var la: JSONObject = [
                "activityId": .string(target), "event": .string(ev),
                "contentState": body["activityContentState"] ?? .object([:]),
            ]
            if let d = body["dismissalDate"] { la["dismissalDate"] = d }
            m["liveActivity"] = .object(la)
        }
        let payload = JSON.object(m).serialized
        guard payload.utf8.count <= PushLimits.maxPayloadBytes else {
            throw .tooLarge("the message exceeds \(PushLimits.maxPayloadBytes) bytes")
        }
        // The msgKey check and the record are one serializable transaction: of two sends with
        // the same msgKey at once (on two instances), one records and publishes, the other
        // conflicts, runs again and answers the first one's msgId as a duplicate.
        enum Recorded {
            case duplicate(String)
            case sent([(token: String, deviceId: String)])
        }
        let recorded = try storage { () throws(StoreError) -> Recorded in
            try store.transaction { () throws(StoreError) -> Recorded in
                if let k = msgKey,
                    let existing = try store.pushExistingSend(appId: appId, targetType: targetType, target: target, msgKey: k)
                {
                    return .duplicate(existing)
                }
                let devices = try store.pushResolve(targetType: targetType, target: target).devices
                try store.pushRecordSend(
                    msgId: msgId, appId: appId, targetType: targetType, target: target, msgKey: msgKey,
                    payload: payload, tokens: devices.map(\.token), now: now)
                return .sent(devices)
            }
        }
        let resolved: (devices: [(token: String, deviceId: String)], appId: String?)
        switch recorded {
        case .duplicate(let existing): return HTTPResponse(["msgId": .string(existing), "devices": 0, "duplicate": true])
        case .sent(let devices): resolved = (devices, appId)
        }
        let tokens = resolved.devices.map(\.token)
        let bytes = Array(payload.utf8)
        if targetType == "broadcast" {
            mqtt.publish(Backend.broadcastTopic, bytes, qos: 1, expirySeconds: UInt32(expired)) { [unowned self] ok in
                guard ok else { self.log.warn("push: broadcast publish failed", ["msgId": msgId]); return }
                self.mark(.puback(msgId: msgId, token: nil, at: System.wallClockMs()))
            }
            log.debug("push: broadcast", ["msgId": msgId, "devices": tokens.count])
            return HTTPResponse(["msgId": .string(msgId), "devices": .int(Int64(tokens.count)), "duplicate": false])
        }
        for (t, device) in resolved.devices {
            mqtt.publish(Backend.deviceTopic(device), bytes, qos: 1, expirySeconds: UInt32(expired)) { [unowned self] ok in
                guard ok else { self.log.warn("push: publish failed", ["msgId": msgId, "token": t]); return }
                self.mark(.puback(msgId: msgId, token: t, at: System.wallClockMs()))
            }
        }
        log.debug("push: sent", ["msgId": msgId, "targetType": targetType, "devices": tokens.count])
        return HTTPResponse(["msgId": .string(msgId), "devices": .int(Int64(tokens.count)), "duplicate": false])
    }

    /// `GET /v1/inspect/push/{bindings|sends|deliveries|opens}` (`?msgId=` filters deliveries).
    func pushInspect(_ request: HTTPRequest, _ what: String) throws(APIError) -> HTTPResponse {
        func q(_ sql: String, _ args: [SQLBind] = []) throws(APIError) -> [[SQLValue]] {
            try storage { () throws(StoreError) in try store.pushQuery(sql, args) }
        }
        func v(_ x: SQLValue) -> JSON {
            switch x {
            case .int(let i): .int(i);
            case .null: .null;
            default: x.text.map { .string($0) } ?? .null
            }
        }
        switch what {
        case "bindings":
            let b = try q("SELECT token, user_id FROM push_bindings ORDER BY user_id, token").map { r -> JSON in
                ["token": v(r[0]), "userId": v(r[1])]
            }
            let d = try q("SELECT token, install_id, active FROM push_devices ORDER BY registered_at").map { r -> JSON in
                ["token": v(r[0]), "installId": v(r[1]), "active": .bool(r[2].int == 1)]
            }
            let a = try q("SELECT activity_id, push_token, token, app_id FROM push_activities ORDER BY activity_id").map { r -> JSON in
                ["activityId": v(r[0]), "pushToken": v(r[1]), "token": v(r[2]), "appId": v(r[3])]
            }
            return HTTPResponse(["bindings": .array(b), "devices": .array(d), "activities": .array(a)])
        case "sends":
            let s = try q("SELECT msg_id, app_id, target_type, target, msg_key, devices, created_at FROM push_sends ORDER BY seq").map {
                r -> JSON in
                [
                    "msgId": v(r[0]), "appId": v(r[1]), "targetType": v(r[2]), "target": v(r[3]), "msgKey": v(r[4]),
                    "devices": v(r[5]), "createdAt": v(r[6]),
                ]
            }
            return HTTPResponse(["sends": .array(s)])
        case "deliveries":
            let sql = "SELECT msg_id, token, published_at, puback_at, acked_at FROM push_deliveries"
            let rows: [[SQLValue]]
            if let m = request.query["msgId"] {
                rows = try q(sql + " WHERE msg_id = ? ORDER BY token", [.text(m)])
            } else {
                rows = try q(sql + " ORDER BY published_at")
            }
            return HTTPResponse([
                "deliveries": .array(
                    rows.map { r in
                        ["msgId": v(r[0]), "token": v(r[1]), "publishedAt": v(r[2]), "pubackAt": v(r[3]), "ackedAt": v(r[4])]
                    })
            ])
        default:  // opens: the push.opens stream the uploader delivers
            let rows = try storage { () throws(StoreError) in try store.records(stream: "push.opens", after: 0, limit: 10_000) }
            return HTTPResponse([
                "opens": .array(
                    rows.map { r in
                        ["id": .string(r.id), "ts": .int(r.ts), "data": (try? JSON.parse(r.data)) ?? .null]
                    })
            ])
        }
    }
}
