import CJSONC
import PylonPluginKit

/// pylon-ma: the MA analytics SDK surface as a service (reference: docs/MA.md).
let plugin = Plugin(name: "ma", version: "0.1.0")
plugin.wantsCallerInfo = true
let ma = MAService(plugin: plugin)
typealias R = MAService

plugin.onReady = { ma.start() }
plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { ma.clientClosed(c) } }

// MARK: start / identifyAccount (strictly serialised per AppKey)

plugin.method("start") { call in
    guard let appKey = call.params["appKey"]?.stringValue?.trimmedWhitespace, !appKey.isEmpty else {
        call.reply(R.result(MACode.invalidParams, "appKey is required"))
        return
    }
    // It names a backend URL path, an uploader stream and a consent switch.
    guard R.validAppKey(appKey) else {
        call.reply(R.result(MACode.invalidParams, "appKey must be 1-\(R.maxAppKeyLength) of [A-Za-z0-9._-]"))
        return
    }
    guard ma.instances[appKey] != nil || ma.instances.count < ma.maxAppKeys else {
        call.reply(R.result(MACode.failed, "too many AppKeys (maxAppKeys \(ma.maxAppKeys))"))
        return
    }
    // Parameters are captured now; a queued start is not affected by later calls.
    let collection = call.params["dataCollectionEnabled"] ?? .null
    guard collection == .null || collection.boolValue != nil else {
        call.reply(R.result(MACode.invalidParams, "dataCollectionEnabled must be true or false"))
        return
    }
    let enable = collection.boolValue ?? true
    let identity = IdentityInput(call.params["userID"]?.objectValue.map { JSON.object($0) })
    let project = call.params["project"]?.stringValue ?? ma.defaultProject
    for k in call.params.objectValue?.keys ?? [] where !["appKey", "dataCollectionEnabled", "userID", "project"].contains(k) {
        plugin.log.warn("ma.start: unknown configuration key ignored", ["key": k])
    }
    let client = call.callerClient
    ma.touch(client, appKey)
    let inst = ma.instances[appKey] ?? MAInstance(appKey: appKey)
    ma.instances[appKey] = inst
    ma.identityOp(inst, call, prepare: {
        // The AppKey switch takes effect when this start begins executing.
        ma.bind(client: client, to: appKey)
        var body: JSONObject = ["deviceId": .string(ma.deviceId), "identity": identity.identityJSON]
        if let project { body["project"] = .string(project) }
        return ("/v1/ma/\(appKey)/start", .object(body))
    }, handle: { j, finish in
        let code = j["code"]?.intValue ?? MACode.failed
        guard code == 0, let euid = j["euid"]?.stringValue else {
            finish(R.result(code == 0 ? MACode.failed : code, j["message"]?.stringValue ?? "start failed"))
            return
        }
        inst.euid = euid
        inst.project = j["project"]?.stringValue ?? project
        inst.identity.merge(identity.valid) { _, new in new }
        inst.started = true
        ma.applyCollection(inst, enabled: enable) { err in  // it persists the instance
            if let err {
                finish(R.result(MACode.failed, err, ["euid": .string(euid)]))
            } else {
                finish(R.result(0, identity.localMessage, ["euid": .string(euid)]))
            }
        }
    })
}

plugin.method("identifyAccount") { call in
    guard let inst = ma.usable(call) else { return }
    let identity = IdentityInput(call.params)  // captured at receipt
    guard !identity.valid.isEmpty else {
        call.reply(R.result(MACode.invalidParams, identity.rejected.isEmpty ? "no valid identifier" : identity.localMessage))
        return
    }
    ma.identityOp(inst, call, prepare: {
        var body: JSONObject = ["deviceId": .string(ma.deviceId), "euid": inst.euid.map { .string($0) } ?? .null,
                                "identity": identity.identityJSON]
        if let p = inst.project { body["project"] = .string(p) }
        return ("/v1/ma/\(inst.appKey)/identify", .object(body))
    }, handle: { j, finish in
        let code = j["code"]?.intValue ?? MACode.failed
        let message = identity.message(server: j["fields"]?.objectValue)
        if code == 0, let euid = j["euid"]?.stringValue {
            inst.euid = euid
            inst.identity.merge(identity.valid) { _, new in new }
            ma.persist(inst)
            finish(R.result(0, message, ["euid": .string(euid)]))
        } else {
            finish(R.result(code == 0 ? MACode.failed : code, message))
        }
    })
}

plugin.method("euid") { call in
    let inst = ma.instance(for: call)
    call.reply(R.result(0, "", ["euid": (inst?.started == true ? inst?.euid : nil).map { .string($0) } ?? .null]))
}

// MARK: Events

plugin.method("eventRecord", consent: "ma:{appKey}", dropWhenDenied: true,
              deniedResult: R.result(0, "")) { call in
    guard let inst = ma.usable(call) else { return }
    // Validated and recorded straight from the parsed json-c tree (no Swift values per event).
    let props = call.paramRef("property")
    let nameRef = call.paramRef("eventName")
    if let why = EventValidation.check(eventNameRef: nameRef, propertyRef: props) {
        call.reply(R.result(MACode.invalidParams, why))
        return
    }
    let name = String(cString: json_object_get_string(nameRef))  // a string: checked above
    inst.whenReady {
        ma.touchSession(inst)
        ma.record(inst, name: name, properties: props) { err in
            if let err { call.reply(R.result(MACode.failed, err)) } else { call.reply(serialized: R.okReply) }
        }
    }
}

// MARK: Consent (data collection switch)

plugin.method("setDataCollectionEnabled") { call in
    guard let inst = ma.usable(call) else { return }
    guard let enabled = call.params["enabled"]?.boolValue else {
        call.reply(R.result(MACode.invalidParams, "enabled (true or false) is required"))
        return
    }
    inst.whenReady {
        if inst.collectionEnabled == enabled {
            call.reply(R.result(0, "unchanged"))
            return
        }
        ma.applyCollection(inst, enabled: enabled) { err in
            call.reply(err.map { R.result(MACode.failed, $0) } ?? R.result(0, ""))
        }
    }
}

plugin.method("isDataCollectionEnabled") { call in
    guard let inst = ma.instance(for: call), inst.started else {
        call.reply(R.result(0, "", ["enabled": .null]))
        return
    }
    call.reply(R.result(0, "", ["enabled": inst.collectionEnabled.map { .bool($0) } ?? .null]))
}

plugin.method("setCollectControl") { call in
    guard let inst = ma.usable(call) else { return }
    // All or nothing: every field is checked before any is applied.
    var changes: [String: Bool] = [:]
    for k in ["idfa", "idfv", "carrier"] {
        guard let v = call.params[k] else { continue }
        guard let b = v.boolValue else {
            call.reply(R.result(MACode.invalidParams, "\(k) must be true or false"))
            return
        }
        changes[k] = b
    }
    for (k, b) in changes { inst.collectControl[k] = b }
    ma.persist(inst)
    call.reply(R.result(0, ""))
}

plugin.method("setUtmProperties") { call in
    guard let inst = ma.usable(call) else { return }
    let allowed: Set<String> = ["utm_source", "utm_medium", "utm_term", "utm_content", "utm_campaign", "utm_id"]
    guard let props = call.params["properties"]?.objectValue else {
        call.reply(R.result(MACode.invalidParams, "properties must be an object"))
        return
    }
    var utm: [String: String] = [:]
    for (k, v) in props {
        guard allowed.contains(k) else {
            call.reply(R.result(MACode.invalidParams, "unknown UTM key \(k)"))
            return
        }
        guard let s = v.stringValue, s.utf8.count <= EventValidation.maxStringBytes else {
            call.reply(R.result(MACode.invalidParams, "\(k) must be a string of at most \(EventValidation.maxStringBytes) bytes"))
            return
        }
        utm[k] = s
    }
    // UTM is collection data: not kept while collection is disabled.
    if inst.collectionEnabled != false {
        inst.utm = utm
        ma.persist(inst)
    }
    call.reply(R.result(0, ""))
}

// MARK: Upload cadence and sessions

plugin.method("setReportInterval") { call in
    guard let inst = ma.usable(call) else { return }
    guard let s = call.params["interval"]?.intValue, s > 0, s <= R.maxReportIntervalS else {
        call.reply(R.result(MACode.invalidParams, "interval (seconds, 1 to \(R.maxReportIntervalS)) is required"))
        return
    }
    ma.configureStream(inst, ["intervalMs": .int(s * 1000)]) { e in
        if let e { call.reply(R.result(MACode.failed, e.message)); return }
        // Held for the app's session (ma.md §6): undone when its last client disconnects —
        // at once if that happened while this call was in flight.
        inst.reportIntervalS = s
        ma.persist(inst)
        if call.callerClient != nil, !ma.sessionActive(inst.appKey) { ma.endReportInterval(inst) }
        call.reply(R.result(0, ""))
    }
}

plugin.method("setMaxEventCacheCount") { call in
    guard let inst = ma.usable(call) else { return }
    guard let n = call.params["count"]?.intValue, n > 0 else {
        call.reply(R.result(MACode.invalidParams, "count (> 0) is required"))
        return
    }
    let count = min(n, 500)  // never above 500
    ma.configureStream(inst, ["maxCount": .int(count)]) { e in
        call.reply(e.map { R.result(MACode.failed, $0.message) } ?? R.result(0, "", ["count": .int(count)]))
    }
}

plugin.method("setSessionTimeout") { call in
    guard let inst = ma.usable(call) else { return }
    guard let s = call.params["interval"]?.intValue, s > 0, s <= R.maxSessionTimeoutS else {
        call.reply(R.result(MACode.invalidParams, "interval (seconds, 1 to \(R.maxSessionTimeoutS)) is required"))
        return
    }
    inst.sessionTimeoutS = s
    ma.persist(inst)
    call.reply(R.result(0, ""))
}

plugin.method("setAppState") { call in
    guard let inst = ma.usable(call) else { return }
    switch call.params["state"]?.stringValue {
    case "background": ma.setBackground(inst, true)
    case "foreground": ma.setBackground(inst, false)
    default:
        call.reply(R.result(MACode.invalidParams, "state must be \"foreground\" or \"background\""))
        return
    }
    call.reply(R.result(0, ""))
}

registerProfileMethods(plugin, ma)

// MARK: Operator view (not an SDK method)

/// `ma.status`: what the plugin is doing, per AppKey — for people and `pylonctl call ma.status`.
/// No identities (EUID, project, identifiers): any client may call it, and apps must not see
/// each other's identity.
plugin.method("status") { call in
    var apps = JSONObject()
    for k in ma.instances.keys.sorted() {
        let i = ma.instances[k]!
        apps[k] = [
            "started": .bool(i.started), "collectionEnabled": i.collectionEnabled.map { .bool($0) } ?? .null,
            "pendingStarts": .int(Int64(i.pendingStarts)), "queuedChannelValues": .int(Int64(i.channelQueue.count)),
            "session": i.sessionId.map { .string($0) } ?? .null, "background": .bool(i.background),
            "sessionTimeoutS": .int(i.sessionTimeoutS), "reportIntervalS": i.reportIntervalS.map { .int($0) } ?? .null,
            "clients": .int(Int64(ma.clientCount(k))),
        ]
    }
    call.reply(["backend": .string(ma.backendURL), "appKeys": .object(apps),
                "heldEvents": .int(Int64(ma.held)), "maxHeldEvents": .int(Int64(ma.maxHeldEvents))])
}

plugin.onShutdown = { ma.http?.shutdown() }
plugin.run()
