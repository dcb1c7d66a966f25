import PylonPluginKit

/// `ma.start`, `ma.identifyAccount` and `ma.euid` (docs/MA.md: `ma.start`, `ma.identifyAccount`, `ma.euid`). Starts and identifies are
/// strictly serialised per AppKey (`identityOp`); parameters are captured at receipt.
extension MAService {
    func start(_ call: Call) {
        guard let appKey = call.params["appKey"]?.stringValue?.trimmedWhitespace, !appKey.isEmpty else {
            call.reply(Self.result(MACode.invalidParams, "appKey is required"))
            return
        }
        // It names a backend URL path, an uploader stream and a consent switch.
        guard AppKey.isValid(appKey) else {
            call.reply(Self.result(MACode.invalidParams, "appKey must be \(AppKey.rule)"))
            return
        }
        guard instances[appKey] != nil || instances.count < config.maxAppKeys else {
            call.reply(Self.result(MACode.failed, "too many AppKeys (maxAppKeys \(config.maxAppKeys))"))
            return
        }
        // Parameters are captured now; a queued start is not affected by later calls.
        let collection = call.params["dataCollectionEnabled"] ?? .null
        guard collection == .null || collection.boolValue != nil else {
            call.reply(Self.result(MACode.invalidParams, "dataCollectionEnabled must be true or false"))
            return
        }
        let input = StartInput(
            enable: collection.boolValue ?? true, userID: call.params["userID"]?.objectValue.map { JSON.object($0) },
            project: call.params["project"]?.stringValue ?? config.project)
        for k in call.params.objectValue?.keys ?? [] where !Self.startKeys.contains(k) {
            plugin.log.warn("ma.start: unknown configuration key ignored", ["key": k])
        }
        let client = call.callerInfo.client
        let uid = call.callerInfo.uid
        if let known = instances[appKey], !mayUse(known, call) {
            call.reply(Self.notYours(appKey))
            return
        }
        touch(client, appKey)
        let inst = instances[appKey] ?? MAInstance(appKey: appKey)
        instances[appKey] = inst
        // The first uid to start it owns it, an admin's included (persisted with the instance):
        // an AppKey root's app started must not be left for another user to claim.
        if inst.ownerUid == nil, case .claim(let o) = Ownership.appKeys.access(nil, caller: CallerInfo(uid: uid), claims: true) {
            inst.ownerUid = o.uid
        }
        // Kept until the backend answers: a restart of this plugin runs it again.
        var kept = input.json
        if let o = inst.ownerUid { kept["ownerUid"] = .int(o) }
        let seq = persistOp(appKey, kind: "start", .object(kept))
        runStart(inst, input, client: client, call: call, opSeq: seq)
    }

    /// Queues a start of `inst` (`call`: nil when run again after a restart; `opSeq`: its row
    /// in `identity_ops`).
    func runStart(_ inst: MAInstance, _ input: StartInput, client: Int64?, call: Call?, opSeq: Int64?) {
        let appKey = inst.appKey
        let identity = IdentityInput(input.userID)
        identityOp(
            inst, call, opSeq: opSeq,
            prepare: { [unowned self] in
                // The AppKey switch takes effect when this start begins executing.
                self.bind(client: client, to: appKey)
                var body: JSONObject = ["deviceId": .string(self.deviceId), "identity": identity.identityJSON]
                if let project = input.project { body["project"] = .string(project) }
                return ("/v1/ma/\(appKey)/start", .object(body))
            },
            handle: { [unowned self] j, finish in
                let code = j["code"]?.intValue ?? MACode.failed
                guard code == 0, let euid = j["euid"]?.stringValue else {
                    finish(Self.result(code == 0 ? MACode.failed : code, j["message"]?.stringValue ?? "start failed"))
                    return
                }
                inst.euid = euid
                inst.project = j["project"]?.stringValue ?? input.project
                inst.identity.merge(identity.valid) { _, new in new }
                inst.started = true
                self.applyCollection(inst, enabled: input.enable) { err in  // it persists the instance
                    if let err {
                        finish(Self.result(MACode.failed, err, ["euid": .string(euid)]))
                    } else {
                        finish(Self.result(0, identity.localMessage, ["euid": .string(euid)]))
                    }
                }
            })
    }

    /// The parameters `ma.start` reads; any other key is logged and ignored (docs/MA.md, `ma.start`).
    static let startKeys: Set<String> = ["appKey", "dataCollectionEnabled", "userID", "project"]

    func identifyAccount(_ call: Call) {
        guard let inst = usable(call) else { return }
        let identity = IdentityInput(call.params)  // captured at receipt
        guard !identity.valid.isEmpty else {
            call.reply(Self.result(MACode.invalidParams, identity.rejected.isEmpty ? "no valid identifier" : identity.localMessage))
            return
        }
        // Kept until the backend answers (the identifiers as given: read again after a restart).
        var kept = JSONObject()
        for (param, wire) in IdentityInput.fields {
            if let v = call.params[param] { kept[param] = v } else if let v = call.params[wire] { kept[wire] = v }
        }
        runIdentify(inst, identity, call: call, opSeq: persistOp(inst.appKey, kind: "identify", .object(kept)))
    }

    /// Queues an identify of `inst` (`call`: nil when run again after a restart).
    func runIdentify(_ inst: MAInstance, _ identity: IdentityInput, call: Call?, opSeq: Int64?) {
        identityOp(
            inst, call, opSeq: opSeq,
            prepare: { [unowned self] in
                var body: JSONObject = [
                    "deviceId": .string(self.deviceId), "euid": inst.euid.map { .string($0) } ?? .null,
                    "identity": identity.identityJSON,
                ]
                if let p = inst.project { body["project"] = .string(p) }
                return ("/v1/ma/\(inst.appKey)/identify", .object(body))
            },
            handle: { [unowned self] j, finish in
                let code = j["code"]?.intValue ?? MACode.failed
                let message = identity.message(server: j["fields"]?.objectValue)
                if code == 0, let euid = j["euid"]?.stringValue {
                    inst.euid = euid
                    inst.identity.merge(identity.valid) { _, new in new }
                    self.persist(inst)
                    finish(Self.result(0, message, ["euid": .string(euid)]))
                } else {
                    finish(Self.result(code == 0 ? MACode.failed : code, message))
                }
            })
    }

    func euid(_ call: Call) {
        let inst = instance(for: call)
        if let inst, !mayUse(inst, call) {
            call.reply(Self.notYours(inst.appKey))
            return
        }
        call.reply(Self.result(0, "", ["euid": (inst?.started == true ? inst?.euid : nil).map { .string($0) } ?? .null]))
    }
}

/// What `ma.start` captured at receipt: the collection switch, the `userID` object and the
/// project (kept in ma.db until the backend answers).
struct StartInput {
    var enable: Bool
    var userID: JSON?
    var project: String?

    init(enable: Bool, userID: JSON?, project: String?) {
        self.enable = enable
        self.userID = userID
        self.project = project
    }

    init(_ j: JSON) {
        enable = j["enable"]?.boolValue ?? true
        userID = j["userID"].flatMap { $0 == .null ? nil : $0 }
        project = j["project"]?.stringValue
    }

    var json: JSONObject {
        ["enable": .bool(enable), "userID": userID ?? .null, "project": project.map { .string($0) } ?? .null]
    }
}
