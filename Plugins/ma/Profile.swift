import PylonPluginKit

/// Contacts, channel values and user properties: validated locally, then sent to the backend.
func registerProfileMethods(_ plugin: Plugin, _ ma: MAService) {
    typealias R = MAService

    /// Posts one profile call for the instance's current EUID and project, replies with the
    /// backend's code, then runs `then`.
    func post(_ call: Call, _ inst: MAInstance, _ path: String, _ body: JSONObject, then: @escaping () -> Void = {}) {
        var b = body
        b["euid"] = inst.euid.map { .string($0) } ?? .null
        if let p = inst.project { b["project"] = .string(p) }
        ma.backend("/v1/ma/\(inst.appKey)/\(path)", .object(b), retry: false) { r in
            switch r {
            case .success(let j):
                call.reply(R.result(j["code"]?.intValue ?? MACode.failed, j["message"]?.stringValue ?? ""))
            case .failure(let e):
                call.reply(R.result(MACode.failed, e.message))
            }
            then()
        }
    }

    /// `post`, once pending starts are done.
    func send(_ call: Call, _ inst: MAInstance, _ path: String, _ body: JSONObject) {
        inst.whenReady { post(call, inst, path, body) }
    }

    /// Property calls are collection data: while collection is off they are not sent.
    func propertyCall(_ call: Call, _ body: () -> Result<JSONObject, MAError>) {
        guard let inst = ma.usable(call) else { return }
        switch body() {
        case .failure(let e): call.reply(R.result(MACode.invalidParams, e.message))
        case .success(let b):
            guard inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) else {
                call.reply(R.result(0, "collection disabled: not sent"))
                return
            }
            send(call, inst, "properties", b)
        }
    }

    plugin.method("setUserContact") { call in
        guard let inst = ma.usable(call) else { return }
        let kinds: Set<String> = ["email", "mobile_phone", "landline_phone", "whatsapp_phone"]
        guard let contacts = call.params["contacts"]?.objectValue else {
            call.reply(R.result(MACode.invalidParams, "contacts (object) is required"))
            return
        }
        var out = JSONObject()
        for (k, v) in contacts {
            guard kinds.contains(k) else { call.reply(R.result(MACode.invalidParams, "unsupported contact kind \(k)")); return }
            if v == .null { continue }  // absent or null: unchanged
            guard let s = v.stringValue else { call.reply(R.result(MACode.invalidParams, "\(k) must be a string")); return }
            if !s.isEmpty && s.trimmedWhitespace.isEmpty { call.reply(R.result(MACode.invalidParams, "\(k) is only whitespace")); return }
            if s.count > 256 { call.reply(R.result(MACode.invalidParams, "\(k) is longer than 256 characters")); return }
            out[k] = .string(s)
        }
        send(call, inst, "contacts", ["contacts": .object(out)])
    }

    plugin.method("setChannelValue") { call in
        guard let inst = ma.usable(call) else { return }
        guard let ch = call.params["channelId"]?.intValue, ch > 0 else {
            call.reply(R.result(MACode.invalidParams, "channelId (integer > 0) is required"))
            return
        }
        guard let arr = call.params["values"]?.arrayValue, !arr.isEmpty, arr.count <= R.maxChannelValues else {
            call.reply(R.result(MACode.invalidParams, "values must be an array of 1 to \(R.maxChannelValues) strings"))
            return
        }
        var values: [JSON] = []
        for v in arr {
            guard let s = v.stringValue?.trimmedWhitespace, !s.isEmpty, s.utf8.count <= R.maxChannelValueBytes else {
                call.reply(R.result(MACode.invalidParams, "every value must be a non-empty string of at most \(R.maxChannelValueBytes) bytes"))
                return
            }
            values.append(.string(s))
        }
        // In call order; invalidated (-2) if the AppKey, project or identity changed meanwhile.
        let client = call.callerClient
        let euid = inst.euid, project = inst.project
        inst.channelQueue.append {
            let boundElsewhere = client.map { ma.clientAppKey[$0] != nil && ma.clientAppKey[$0] != inst.appKey } ?? false
            if boundElsewhere || inst.euid != euid || inst.project != project {
                call.reply(R.result(MACode.notStarted, "AppKey, project or identity changed while the request was queued"))
                inst.channelDone()
                return
            }
            post(call, inst, "channel", ["channelId": .int(ch), "values": .array(values)], then: inst.channelDone)
        }
        inst.whenReady { inst.channelKick() }
    }

    plugin.method("setProperty") { call in
        propertyCall(call) { PropertyValidation.setProperties(call.params).map { ["op": "set", "properties": .object($0)] } }
    }
    plugin.method("increaseProperty") { call in
        propertyCall(call) {
            PropertyValidation.keyed(call.params, PropertyValidation.isFiniteNumber, what: "must be a finite number")
                .map { ["op": "increase", "properties": .object($0)] }
        }
    }
    plugin.method("addProperty") { call in
        propertyCall(call) {
            PropertyValidation.keyed(call.params, { $0.arrayValue != nil }, what: "must be an array")
                .map { ["op": "add", "properties": .object($0)] }
        }
    }
    plugin.method("removeProperty") { call in
        propertyCall(call) {
            PropertyValidation.keyed(call.params, { $0.arrayValue != nil }, what: "must be an array")
                .map { ["op": "remove", "properties": .object($0)] }
        }
    }
    plugin.method("deleteProperty") { call in
        propertyCall(call) {
            guard let k = call.params["key"]?.stringValue else { return .failure(MAError(message: "key is required")) }
            if let why = PropertyValidation.checkName(k) { return .failure(MAError(message: why)) }
            return .success(["op": "delete", "keys": [.string(k)]])
        }
    }
    plugin.method("updateObjectArrayProperty") { call in
        propertyCall(call) {
            PropertyValidation.elementTarget(call.params).flatMap { t in
                guard let values = call.params["values"]?.objectValue else { return .failure(MAError(message: "values (object) is required")) }
                if values[t.identifierKey] != nil { return .failure(MAError(message: "values must not contain the identifier key")) }
                if let why = PropertyValidation.checkSubfields(values, requireNonNull: false, context: "values") {
                    return .failure(MAError(message: why))
                }
                return .success(t.body(op: "updateObjectArray", ["values": .object(values)]))
            }
        }
    }
    plugin.method("addObjectArrayProperty") { call in
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
    plugin.method("removeObjectArrayProperty") { call in
        propertyCall(call) { PropertyValidation.elementTarget(call.params).map { $0.body(op: "removeObjectArray") } }
    }
}
