import PylonPluginKit

/// The Live Activity token submissions: the repeat filter of `push.liveActivityBind` and the
/// content-state schemas apps declare. A value type.
///
/// A repeat is a call with the same `activityId` and `pushToken` as one that succeeded or is in
/// flight; a failed submission is forgotten, so re-submitting it is not a repeat.
struct LiveActivities {
    enum Filter: String { case abandon, call, refuse }
    enum Decision: Equatable { case submit, dropSilently, failRepeat }

    struct Key: Hashable { var activityId: String, pushToken: String }
    enum SubmissionState { case inFlight, succeeded }

    private(set) var submissions: [Key: SubmissionState] = [:]
    /// activityId → the app that bound it and its declared content-state schema.
    private(set) var bound: [String: (appId: String, schema: [String: String]?)] = [:]
    /// activityId → the app whose first bind of it is in flight: it is that app's from the
    /// moment its bind is admitted, so another app's bind cannot overtake it.
    private(set) var claimed: [String: String] = [:]

    /// The app an activity belongs to: the one that bound it, or whose bind is in flight.
    func owner(of activityId: String) -> String? { bound[activityId]?.appId ?? claimed[activityId] }

    /// Admits `appId`'s bind of `activityId` (`owner(of:)` is nil or `appId`).
    mutating func claim(_ activityId: String, for appId: String) {
        if bound[activityId] == nil { claimed[activityId] = appId }
    }

    mutating func decide(_ key: Key, filter: Filter) -> Decision {
        if filter != .refuse, submissions[key] != nil { return filter == .abandon ? .dropSilently : .failRepeat }
        submissions[key] = .inFlight
        return .submit
    }

    mutating func finished(_ key: Key, ok: Bool, appId: String, schema: [String: String]?) {
        if ok {
            submissions[key] = .succeeded
            // A new token for the activity keeps the schema declared earlier unless it declares one.
            bound[key.activityId] = (appId, schema ?? bound[key.activityId]?.schema)
        } else {
            submissions[key] = nil
        }
        // Bound, or free again if this was the claim's bind and it failed (with none in flight).
        if claimed[key.activityId] == appId, ok || !submissions.keys.contains(where: { $0.activityId == key.activityId }) {
            claimed[key.activityId] = nil
        }
    }

    mutating func restore(activityId: String, pushToken: String, appId: String, schema: [String: String]?) {
        submissions[Key(activityId: activityId, pushToken: pushToken)] = .succeeded
        bound[activityId] = (appId, schema)
    }

    static let types: Set<String> = ["string", "number", "integer", "boolean", "object", "array"]

    /// A schema as declared at bind time: `{"field": "string" | "number" | "integer" |
    /// "boolean" | "object" | "array"}`; nil when it is not one.
    static func parseSchema(_ j: JSON?) -> [String: String]?? {
        guard let j, !j.isNull else { return .some(nil) }
        guard let o = j.objectValue, o.count <= 64 else { return nil }
        var s: [String: String] = [:]
        for (k, v) in o {
            guard let t = v.stringValue, types.contains(t) else { return nil }
            s[k] = t
        }
        return .some(s)
    }

    /// Why `state` does not match `schema` (same field names, matching types), or nil.
    static func mismatch(_ state: JSON?, _ schema: [String: String]) -> String? {
        guard let o = state?.objectValue else { return "contentState is not an object" }
        for (k, v) in o {
            guard let t = schema[k] else { return "undeclared field \(k)" }
            let ok: Bool
            switch (t, v) {
            case ("string", .string), ("boolean", .bool), ("object", .object), ("array", .array),
                ("number", .int), ("number", .double), ("integer", .int):
                ok = true
            default: ok = false
            }
            if !ok { return "field \(k) is not \(t)" }
        }
        for k in schema.keys where o[k] == nil { return "missing field \(k)" }
        return nil
    }
}
