import PylonPluginKit
import PylonStore

/// The bus methods other than attach/detach (push.md's table).
///
/// The device's push identity (its token and bound user) is the device owner's: `push.bind`,
/// `push.unbind` and `push.setDeviceToken` need an admin client (host `disclosure.admins`) or a
/// uid in the plugin's `ownerUids` (or another plugin calling on its own); others get 3003.
/// `push.status` and `push.register` show the token, install id, device id and bound user to
/// those callers only; other callers see the connection and counters and their own apps.
extension PushService {
    /// Whether `call`'s caller may change or see the device's push identity.
    func isOwner(_ call: Call) -> Bool {
        let c = call.callerInfo
        if c.isAdmin { return true }
        if c.client == nil, c.plugin != nil { return true }  // a plugin on its own behalf
        guard let uid = c.uid else { return false }
        return config.ownerUids.contains(uid)
    }

    /// 3003 unless the caller owns the device's push identity (`isOwner`).
    func requireOwner(_ call: Call) -> Bool {
        guard isOwner(call) else {
            call.reply(reply(PushCode.notPermitted, "changing this device's push identity needs an admin client or a uid in ownerUids"))
            return false
        }
        return true
    }

    /// `push.register {timeoutMs?}` → `{code, token}`; 3001 when no token within the wait.
    func registerCall(_ call: Call) {
        let timeout = call.params["timeoutMs"]?.intValue.map { min(max($0, 1), 600_000) } ?? config.tokenWaitMs
        perform(reg.requestRegistration())
        waitForToken(timeoutMs: timeout) { [unowned self] token in
            if let token {
                call.reply(self.reply(PushCode.ok, "", self.isOwner(call) ? ["token": .string(token)] : [:]))
            } else {
                call.reply(self.reply(PushCode.needToken, "NEED_DELIVERYTOKEN"))
            }
        }
    }

    /// `push.setDeviceToken {token}`: a token obtained elsewhere (hex), registered for this install.
    func setDeviceToken(_ call: Call) {
        guard requireOwner(call) else { return }
        guard let t = call.params["token"]?.stringValue?.lowercased(), (16...128).contains(t.utf8.count),
            t.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
        else {
            call.reply(reply(PushCode.invalidParams, "token must be 16 to 128 hex digits"))
            return
        }
        guard deviceToken != nil else {
            registerDevice { [unowned self] ok in
                if ok {
                    self.setDeviceToken(call)
                } else {
                    call.reply(self.reply(PushCode.backend, "the device could not register with the push backend"))
                }
            }
            return
        }
        post("/v1/push/register", ["installId": .string(installId), "token": .string(t)]) { [unowned self] r in
            guard case .success(let j) = r, j["code"]?.intValue == 0 else {
                call.reply(self.reply(PushCode.backend, "the push backend did not accept the token"))
                return
            }
            self.tokenFromApp(t)
            call.reply(self.reply(PushCode.ok, ""))
        }
    }

    /// Another token than the one held asks the machine for `.rebind` (the bound user follows).
    private func tokenFromApp(_ t: String) {
        try? store.set("token", t)
        perform(reg.setToken(t, now: now))
    }

    /// `push.bind` / `push.unbind {userId}` → `{code, message}`, in call order, each after a token
    /// exists (3001 when the wait times out), 3012 without a user id.
    func bind(_ call: Call, unbind: Bool) {
        guard requireOwner(call) else { return }
        guard let user = call.params["userId"]?.stringValue?.trimmedPush, !user.isEmpty else {
            call.reply(reply(PushCode.needUserId, "NEED_USERID"))
            return
        }
        guard user.utf8.count <= 256 else {
            call.reply(reply(PushCode.invalidParams, "userId exceeds 256 bytes"))
            return
        }
        guard ops.count < config.maxQueuedOps else {
            call.reply(reply(PushCode.limit, "too many queued calls (maxQueuedOps \(config.maxQueuedOps))"))
            return
        }
        enqueueOp(timedOut: { [unowned self] in call.reply(self.reply(PushCode.needToken, "NEED_DELIVERYTOKEN")) }) {
            [unowned self] token, finish in
            self.post(unbind ? "/v1/push/unbind" : "/v1/push/bind", ["token": .string(token), "userId": .string(user)]) { r in
                // The backend lost the device or its token: again once registered again.
                if let why = Self.loss(r) { return finish(.retry(why)) }
                switch r {
                case .success(let j):
                    let code = j["code"]?.intValue ?? PushCode.backend
                    if code == 0 {
                        if unbind {
                            if self.boundUser == user { self.boundUser = nil }
                        } else {
                            self.boundUser = user
                        }
                        try? self.store.set("user", self.boundUser)
                    }
                    call.reply(self.reply(code, j["message"]?.stringValue ?? ""))
                case .failure(let e):
                    call.reply(self.reply(PushCode.backend, e.description))
                }
                finish(.done)
            }
        }
    }

    /// `push.openLogReport {userInfo}`: hands the open to the uploader (stream `push.opens`),
    /// once per message id. The host refuses it while `push:opens` is denied.
    func openLogReport(_ call: Call) {
        guard let info = call.params["userInfo"], let id = info["id"]?.stringValue, id.isValidPushId else {
            call.reply(reply(PushCode.invalidParams, "userInfo (the message as delivered, with its id) is required"))
            return
        }
        guard plugin.isConsentGranted("push:opens") else {
            call.reply(reply(PushCode.reportFailed, "consent push:opens is denied"))
            return
        }
        if store.openReported(id) {
            call.reply(reply(PushCode.ok, "", ["duplicate": true]))
            return
        }
        let data: JSON = [
            "msgId": .string(id), "appId": info["appId"] ?? .null, "token": reg.token.map { .string($0) } ?? .null,
            "openedAt": .int(now),
        ]
        let params: JSON = [
            "stream": "push.opens", "consent": "push:opens",
            "records": [["id": .string(id), "data": data]],
        ]
        plugin.call("uploader.enqueue", params) { [unowned self] r in
            switch r {
            case .success:
                try? self.store.markOpen(id)
                self.counters.opensReported += 1
                call.reply(self.reply(PushCode.ok, ""))
            case .failure(let e):
                call.reply(self.reply(PushCode.reportFailed, e.message))
            }
        }
    }

    /// `push.liveActivityBind {activityId, pushToken, filter, contentStateSchema?, appId?}`.
    func liveActivityBind(_ call: Call) {
        guard let aid = call.params["activityId"]?.stringValue, aid.isValidPushId,
            let pt = call.params["pushToken"]?.stringValue, !pt.isEmpty, pt.utf8.count <= 256
        else {
            call.reply(reply(PushCode.invalidParams, "activityId (1-128 of [A-Za-z0-9._-]) and pushToken are required"))
            return
        }
        guard let filter = LiveActivities.Filter(rawValue: call.params["filter"]?.stringValue ?? "call") else {
            call.reply(reply(PushCode.invalidParams, "filter must be abandon, call or refuse"))
            return
        }
        guard let schemaOpt = LiveActivities.parseSchema(call.params["contentStateSchema"]) else {
            call.reply(
                reply(PushCode.invalidParams, "contentStateSchema maps field names to string, number, integer, boolean, object or array"))
            return
        }
        let client = call.callerInfo.client
        let appId = call.params["appId"]?.stringValue ?? attached.first(where: { $0.value.client == client })?.key
        guard let appId, appId.isValidPushId else {
            call.reply(reply(PushCode.invalidParams, "appId is required (or attach the app first)"))
            return
        }
        // A caller without a uid (a plugin on its own) is not refused here; a uid must own the
        // app, or be an admin (the kit's rule, `Ownership.pushApps`).
        let caller = call.callerInfo
        if caller.uid != nil, let owner = store.appOwner(appId),
            !Ownership.pushApps.access(.uid(owner), caller: caller, claims: false).isAllowed
        {
            call.reply(reply(PushCode.notPermitted, "appId \(appId) belongs to another user"))
            return
        }
        guard ops.count < config.maxQueuedOps else {
            call.reply(reply(PushCode.limit, "too many queued calls (maxQueuedOps \(config.maxQueuedOps))"))
            return
        }
        // An activity stays with the app that bound it: another app (another uid's, say) binding
        // the same id would have its updates delivered to itself.
        if let owner = activities.owner(of: aid), owner != appId {
            call.reply(reply(PushCode.notPermitted, "activity \(aid) is bound to another app"))
            return
        }
        let key = LiveActivities.Key(activityId: aid, pushToken: pt)
        switch activities.decide(key, filter: filter) {
        case .dropSilently:
            call.reply(["code": 0, "dropped": true])
            return
        case .failRepeat:
            call.reply(reply(PushCode.callRepeat, "callRepeat"))
            return
        case .submit: activities.claim(aid, for: appId)
        }
        enqueueOp(timedOut: { [unowned self] in
            self.activities.finished(key, ok: false, appId: appId, schema: schemaOpt)
            call.reply(self.reply(PushCode.needToken, "NEED_DELIVERYTOKEN"))
        }) { [unowned self] token, finish in
            let body: JSON = ["token": .string(token), "activityId": .string(aid), "pushToken": .string(pt), "appId": .string(appId)]
            self.post("/v1/push/liveactivity", body) { r in
                if let why = Self.loss(r) { return finish(.retry(why)) }
                let code: Int64
                var message = ""
                switch r {
                case .success(let j):
                    code = j["code"]?.intValue ?? PushCode.backend
                    message = j["message"]?.stringValue ?? ""
                case .failure(let e):
                    code = PushCode.backend
                    message = e.description
                }
                self.activities.finished(key, ok: code == 0, appId: appId, schema: schemaOpt)
                if code == 0 {
                    let schemaText = self.activities.bound[aid]?.schema.map { s in
                        JSON.object(JSONObject(s.map { ($0.key, JSON.string($0.value)) })).serialized
                    }
                    try? self.store.saveActivity(aid, pushToken: pt, appId: appId, schema: schemaText)
                }
                call.reply(self.reply(code, message))
                finish(.done)
            }
        }
    }

    /// `push.status`: connection, registration, attachments, inbox and counters (no message
    /// content). The identity (token, install id, device id, bound user) and other uids' apps
    /// only for an owner (`isOwner`).
    func status(for call: Call) -> JSON {
        // The counters say what is durable: acknowledgements of this loop turn are deleted from
        // the inbox first (else `acknowledged` could count one a kill -9 now would redeliver).
        if !pendingDeletes.isEmpty { flushAcks() }
        let owner = isOwner(call)
        let uid = call.callerInfo.uid
        let d = delivery.counters
        let c = counters
        var o: JSONObject = [
            "code": 0,
            "connection": .string(mqtt?.state.rawValue ?? "disconnected"),
            "lastError": mqtt?.lastError.map { .string($0) } ?? .null,
            "broker": mqtt.map { .string($0.broker.description) } ?? .null,
            "brokerProtocol": mqtt.map { .string($0.protocolVersion == 5 ? "5" : "3.1.1") } ?? .null,
            "registration": .string(reg.phase.rawValue),
            "reregistration": [
                "count": .int(Int64(reg.reregistrations)), "lastMs": reg.lastReregisterMs.map { .int($0) } ?? .null,
                "reason": reg.reason.map { .string($0.rawValue) } ?? .null, "lastCheckMs": reg.lastCheckMs.map { .int($0) } ?? .null,
                "checkIntervalMs": .int(config.registrationCheckMs),
            ],
            "deviceRegistered": .bool(deviceToken != nil),
            "attachedApps": .array(attached.filter { owner || $0.value.uid == uid }.keys.sorted().map { .string($0) }),
            "ownerChanges": .int(Int64(ownerChanges)),
            "inbox": [
                "count": .int(Int64(delivery.count)), "bytes": .int(Int64(delivery.bytes)),
                "maxCount": .int(Int64(config.delivery.maxCount)), "maxBytes": .int(Int64(config.delivery.maxBytes)),
            ],
            "counters": [
                "received": .int(Int64(c.received)), "delivered": .int(Int64(d.delivered)),
                "acknowledged": .int(Int64(d.acknowledged)), "duplicates": .int(Int64(c.duplicates)),
                "expired": .int(Int64(d.expired)), "malformed": .int(Int64(c.malformed)), "dropped": .int(Int64(d.dropped)),
                "redelivered": .int(Int64(d.redelivered)), "failedDeliveries": .int(Int64(d.failed)),
                "schemaMismatch": .int(Int64(c.schemaMismatch)), "unknownFields": .int(Int64(c.unknownFields)),
                "backendErrors": .int(Int64(c.backendErrors)), "opensReported": .int(Int64(c.opensReported)),
                "brokerConnects": .int(Int64(mqtt?.connects ?? 0)), "brokerDisconnects": .int(Int64(mqtt?.disconnects ?? 0)),
                "brokerSubscribeRefusals": .int(Int64(mqtt?.subscribeRefusals ?? 0)),
            ],
        ]
        if owner {
            o["token"] = reg.token.map { .string($0) } ?? .null
            o["installId"] = .string(installId)
            o["deviceId"] = deviceId.map { .string($0) } ?? .null
            o["boundUser"] = boundUser.map { .string($0) } ?? .null
        }
        return .object(o)
    }
}

extension JSONObject {
    init(_ pairs: [(String, JSON)]) {
        self.init()
        for (k, v) in pairs { self[k] = v }
    }
}

extension String {
    var trimmedPush: String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" || f == "\n" || f == "\r" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\n" || l == "\r" { s = s.dropLast() }
        return String(s)
    }
}
