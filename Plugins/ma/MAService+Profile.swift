import PylonPluginKit

/// Contacts, channel values and user properties (docs/MA.md: `ma.setUserContact`, `ma.setChannelValue`, "User properties"): validated locally
/// (`PropertyValidation`), then sent to the backend for the instance's current EUID and project.
extension MAService {
    /// The contact kinds `ma.setUserContact` accepts.
    static let contactKinds: Set<String> = ["email", "mobile_phone", "landline_phone", "whatsapp_phone"]
    /// A contact is at most this many characters.
    static let maxContactLength = 256

    /// The -1 answer of a backend call not sent because the AppKey waits for the network.
    static func offlineResult(_ w: NetworkWait) -> JSON {
        result(MACode.failed, "backend unreachable: waiting for the network since \(w.sinceMs) (\(w.reason)); not sent")
    }

    func setUserContact(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let contacts = call.params["contacts"]?.objectValue else {
            call.reply(Self.result(MACode.invalidParams, "contacts (object) is required"))
            return
        }
        var out = JSONObject()
        for (k, v) in contacts {
            guard Self.contactKinds.contains(k) else {
                call.reply(Self.result(MACode.invalidParams, "unsupported contact kind \(k)")); return
            }
            if v == .null { continue }  // absent or null: unchanged
            guard let s = v.stringValue else { call.reply(Self.result(MACode.invalidParams, "\(k) must be a string")); return }
            if !s.isEmpty && s.trimmedWhitespace.isEmpty {
                call.reply(Self.result(MACode.invalidParams, "\(k) is only whitespace")); return
            }
            if s.count > Self.maxContactLength {
                call.reply(Self.result(MACode.invalidParams, "\(k) is longer than \(Self.maxContactLength) characters"))
                return
            }
            out[k] = .string(s)
        }
        sendProfile(call, inst, "contacts", ["contacts": .object(out)])
    }

    func setChannelValue(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let ch = call.params["channelId"]?.intValue, ch > 0 else {
            call.reply(Self.result(MACode.invalidParams, "channelId (integer > 0) is required"))
            return
        }
        guard let arr = call.params["values"]?.arrayValue, !arr.isEmpty, arr.count <= Self.maxChannelValues else {
            call.reply(Self.result(MACode.invalidParams, "values must be an array of 1 to \(Self.maxChannelValues) strings"))
            return
        }
        var values: [JSON] = []
        for v in arr {
            guard let s = v.stringValue?.trimmedWhitespace, !s.isEmpty, s.utf8.count <= Self.maxChannelValueBytes else {
                call.reply(
                    Self.result(
                        MACode.invalidParams, "every value must be a non-empty string of at most \(Self.maxChannelValueBytes) bytes"))
                return
            }
            values.append(.string(s))
        }
        if let w = inst.networkWait {
            call.reply(Self.offlineResult(w))
            return
        }
        // In call order; invalidated (-2) if the AppKey, project or identity changed meanwhile.
        let client = call.callerInfo.client
        let euid = inst.euid, project = inst.project
        inst.channelQueue.append { [unowned self] in
            let boundElsewhere = client.map { self.clientAppKey[$0] != nil && self.clientAppKey[$0] != inst.appKey } ?? false
            if boundElsewhere || inst.euid != euid || inst.project != project {
                call.reply(Self.result(MACode.notStarted, "AppKey, project or identity changed while the request was queued"))
                inst.channelDone()
                return
            }
            self.postProfile(call, inst, "channel", ["channelId": .int(ch), "values": .array(values)], then: inst.channelDone)
        }
        inst.whenReady { inst.channelKick() }
    }

    func setProperty(_ call: Call) {
        propertyCall(call) { PropertyValidation.setProperties(call.params).map { ["op": "set", "properties": .object($0)] } }
    }

    func increaseProperty(_ call: Call) {
        propertyCall(call) {
            PropertyValidation.keyed(call.params, PropertyValidation.isFiniteNumber, what: "must be a finite number")
                .map { ["op": "increase", "properties": .object($0)] }
        }
    }

    func addProperty(_ call: Call) {
        propertyCall(call) {
            PropertyValidation.keyed(call.params, { $0.arrayValue != nil }, what: "must be an array")
                .map { ["op": "add", "properties": .object($0)] }
        }
    }

    func removeProperty(_ call: Call) {
        propertyCall(call) {
            PropertyValidation.keyed(call.params, { $0.arrayValue != nil }, what: "must be an array")
                .map { ["op": "remove", "properties": .object($0)] }
        }
    }

    func deleteProperty(_ call: Call) {
        propertyCall(call) {
            guard let k = call.params["key"]?.stringValue else { return .failure(MAError(message: "key is required")) }
            if let why = PropertyValidation.checkName(k) { return .failure(MAError(message: why)) }
            return .success(["op": "delete", "keys": [.string(k)]])
        }
    }

    func updateObjectArrayProperty(_ call: Call) {
        propertyCall(call) {
            PropertyValidation.elementTarget(call.params).flatMap { t in
                guard let values = call.params["values"]?.objectValue else {
                    return .failure(MAError(message: "values (object) is required"))
                }
                if values[t.identifierKey] != nil { return .failure(MAError(message: "values must not contain the identifier key")) }
                if let why = PropertyValidation.checkSubfields(values, requireNonNull: false, context: "values") {
                    return .failure(MAError(message: why))
                }
                return .success(t.body(op: "updateObjectArray", ["values": .object(values)]))
            }
        }
    }

    func addObjectArrayProperty(_ call: Call) {
        propertyCall(call) {
            let p = call.params
            guard let k = p["key"]?.stringValue, let o = p["object"]?.objectValue else {
                return .failure(MAError(message: "key and object are required"))
            }
            if let why = PropertyValidation.checkName(k) ?? PropertyValidation.checkSubfields(o, requireNonNull: true, context: "object") {
                return .failure(MAError(message: why))
            }
            return .success(["op": "addObjectArray", "key": .string(k), "object": .object(o)])
        }
    }

    func removeObjectArrayProperty(_ call: Call) {
        propertyCall(call) { PropertyValidation.elementTarget(call.params).map { $0.body(op: "removeObjectArray") } }
    }

    // MARK: Sending

    /// Posts one profile call for the instance's current EUID and project, replies with the
    /// backend's code, then runs `then`.
    private func postProfile(_ call: Call, _ inst: MAInstance, _ path: String, _ body: JSONObject, then: @escaping () -> Void = {}) {
        var b = body
        b["euid"] = inst.euid.map { .string($0) } ?? .null
        if let p = inst.project { b["project"] = .string(p) }
        backend("/v1/ma/\(inst.appKey)/\(path)", .object(b), retry: false) { r in
            switch r {
            case .success(let j):
                call.reply(Self.result(j["code"]?.intValue ?? MACode.failed, j["message"]?.stringValue ?? ""))
            case .failure(let e):
                call.reply(Self.result(MACode.failed, e.message))
            }
            then()
        }
    }

    /// `postProfile`, once pending starts are done.
    /// While a start or identify of the AppKey waits for the network the call is not kept: it is
    /// answered -1 at once, as one attempt against an unreachable backend is (docs/MA.md, "Offline").
    private func sendProfile(_ call: Call, _ inst: MAInstance, _ path: String, _ body: JSONObject) {
        if let w = inst.networkWait {
            call.reply(Self.offlineResult(w))
            return
        }
        inst.whenReady { [unowned self] in self.postProfile(call, inst, path, body) }
    }

    /// Property calls are collection data: while collection is off they are not sent.
    private func propertyCall(_ call: Call, _ body: () -> Result<JSONObject, MAError>) {
        guard let inst = usable(call) else { return }
        switch body() {
        case .failure(let e): call.reply(Self.result(MACode.invalidParams, e.message))
        case .success(let b):
            guard inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) else {
                call.reply(Self.result(0, "collection disabled: not sent"))
                return
            }
            sendProfile(call, inst, "properties", b)
        }
    }
}
