import PylonCore
import PylonStore

/// Runs one MA call of one AppKey inside its request's transaction. Checks, in order: the
/// AppKey is not disabled (-4); the body is an object; any call but start names no other
/// `project` (-6); the body's fields (-3, 40xx); the `euid` is known (-1). Then the call.
///
/// The decisions are made by `IdentityResolver` and `PropertyOp`, which are pure; this type
/// reads their inputs from the `Store` and writes their outcome back.
struct MACalls {
    let store: Store
    let appKey: String
    /// Wall-clock milliseconds, for new users.
    let now: Int64

    /// The reply body (always answered with HTTP 200).
    func run(_ call: MACall, _ body: JSON) throws(StoreError) -> JSON {
        let app = try store.maApp(appKey, withMetadata: call == .properties)
        if app.disabled { return MAError.maDisabled.body }
        guard let o = body.objectValue else { return MAError.invalid("body must be a JSON object").body }
        if call != .start, let p = o["project"]?.stringValue, p != app.project { return MAError.switched.body }
        switch call {
        case .start: return try start(o, app)
        case .identify: return try identify(o)
        case .contacts: return try contacts(o)
        case .channel: return try channel(o)
        case .properties: return try properties(o, app)
        }
    }

    /// Resolves the device's identity (without per-field results) and answers the EUID and
    /// the current project. A start naming another project is not refused: start is how a
    /// client learns the new one after -6.
    private func start(_ o: JSONObject, _ app: Store.MAApp) throws(StoreError) -> JSON {
        let req: MARequest.Start
        do throws(MAError) { req = try MARequest.start(o) } catch { return error.body }
        let current = try store.maHolder(appKey, .device, req.deviceID)
        let euid = try resolve(req.identity.valid, deviceID: req.deviceID, current: current).euid
        return ["code": 0, "euid": .string(euid), "project": .string(app.project)]
    }

    /// The current user is the request's `euid` when the server knows it, else the device's.
    private func identify(_ o: JSONObject) throws(StoreError) -> JSON {
        let req: MARequest.Identify
        do throws(MAError) { req = try MARequest.identify(o) } catch { return error.body }
        if req.identity.valid.isEmpty {
            var reply = MAError(.invalidParameter, "no valid identifier").body.objectValue!
            reply["fields"] = MACalls.fieldsJSON(req.identity.rejected)
            return .object(reply)
        }
        var current: String?
        if let e = req.euid, try store.maUserExists(appKey, e) {
            current = e
        } else {
            current = try store.maHolder(appKey, .device, req.deviceID)
        }
        let r = try resolve(req.identity.valid, deviceID: req.deviceID, current: current)
        let fields = req.identity.rejected.merging(r.fields) { a, _ in a }
        return ["code": 0, "euid": .string(r.euid), "fields": MACalls.fieldsJSON(fields)]
    }

    private func contacts(_ o: JSONObject) throws(StoreError) -> JSON {
        let req: MARequest.Contacts
        do throws(MAError) { req = try MARequest.contacts(o) } catch { return error.body }
        guard var c = try store.maDocument(appKey, req.euid, .contacts) else { return MAError.unknownUser.body }
        for change in req.changes { c[change.kind] = change.value.map(JSON.string) }
        try store.setMADocument(appKey, req.euid, .contacts, c)
        return ["code": 0]
    }

    private func channel(_ o: JSONObject) throws(StoreError) -> JSON {
        let req: MARequest.Channel
        do throws(MAError) { req = try MARequest.channel(o) } catch { return error.body }
        guard try store.maUserExists(appKey, req.euid) else { return MAError.unknownUser.body }
        try store.maAppendChannelValues(appKey, req.euid, channelID: req.channelID, req.values)
        return ["code": 0]
    }

    private func properties(_ o: JSONObject, _ app: Store.MAApp) throws(StoreError) -> JSON {
        let req: MARequest.Properties
        do throws(MAError) { req = try MARequest.properties(o) } catch { return error.body }
        guard let props = try store.maDocument(appKey, req.euid, .properties) else { return MAError.unknownUser.body }
        let next: JSONObject
        do throws(MAError) { next = try req.op.applied(to: props, metadata: app.metadata) } catch { return error.body }
        if next != props { try store.setMADocument(appKey, req.euid, .properties, next) }
        return ["code": 0, "message": "success"]
    }

    // MARK: Helpers

    /// Resolves `valid` (see `IdentityResolver`) and applies the outcome: creates the user if
    /// new, attaches the identifiers, binds the device to it.
    private func resolve(
        _ valid: [IdentityKind: String], deviceID: String, current: String?
    ) throws(StoreError) -> (euid: String, fields: [IdentityKind: FieldResult]) {
        let r = IdentityResolver.resolve(valid, try store.maGraphView(appKey, valid, current: current))
        let euid: String
        if let existing = r.euid {
            euid = existing
        } else {
            euid = try store.maCreateUser(appKey, at: now)
        }
        for a in r.attach { try store.maAttach(appKey, euid, a.kind, a.value) }
        try store.maBindDevice(appKey, deviceID, to: euid)
        return (euid, r.fields)
    }

    /// `{"user_id": {"code": N, "msg"?}, ...}` in the order user_id, anonymous_id, email, phone.
    static func fieldsJSON(_ fields: [IdentityKind: FieldResult]) -> JSON {
        var o = JSONObject()
        for kind in IdentityKind.sendable {
            if let r = fields[kind] { o[kind.rawValue] = r.json }
        }
        return .object(o)
    }
}
