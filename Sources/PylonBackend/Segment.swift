import PylonCore
import PylonProtocol

/// A saved audience of an AppKey's MA users (docs/AUTOMATION.md "Segments"): every condition
/// holds (AND) — a profile property, an identity of a kind, a push binding, and event history
/// ("did / did not record EVENT at least N times in the last D days"). Parsed and validated
/// here; evaluated by the store (`Store+Segments.swift`), profile conditions in Swift.
struct Segment: Equatable {
    enum Condition: Equatable {
        /// A profile property (`"property": "profile.NAME"`, the trigger operators).
        case profile(AutomationRule.Condition)
        /// Has (or, `has: false`, has not) an identity of `kind` (`user_id`, `email`, ...).
        case identity(kind: String, has: Bool)
        /// Its `user_id` identity is (or is not) bound to an active push device.
        case pushBinding(Bool)
        /// Recorded `event` at least `atLeast` times in the last `days` days (`negate`: fewer).
        case did(event: String, atLeast: Int, days: Int, negate: Bool)
    }

    var name: String
    var appKey: String
    var conditions: [Condition]

    /// The profile conditions (checked in Swift) and the others (in SQL).
    var profileConditions: [AutomationRule.Condition] {
        conditions.compactMap {
            if case .profile(let c) = $0 { return c }
            return nil
        }
    }

    func matchesProfile(_ properties: JSON) -> Bool { profileConditions.allSatisfy { $0.holds(properties) } }

    var json: JSON {
        let cs: [JSON] = conditions.map { c in
            switch c {
            case .profile(let p):
                var o = p.json.objectValue ?? [:]
                o["property"] = .string("profile." + p.property)
                return .object(o)
            case .identity(let kind, let has): return ["identity": .string(kind), "has": .bool(has)]
            case .pushBinding(let b): return ["pushBinding": .bool(b)]
            case .did(let e, let n, let d, let negate):
                return [negate ? "didNot" : "did": .string(e), "atLeast": .int(Int64(n)), "days": .int(Int64(d))]
            }
        }
        return ["name": .string(name), "appKey": .string(appKey), "conditions": .array(cs)]
    }

    static func parse(_ j: JSON) throws(AutomationError) -> Segment {
        guard let o = j.objectValue else {
            throw AutomationError("", "a segment must be a JSON object {\"name\", \"appKey\", \"conditions\"}")
        }
        try AutomationRule.only(o, ["name", "appKey", "conditions"], at: "")
        let name = try AutomationRule.string(o["name"], "name", max: AutomationLimits.maxNameBytes)
        let appKey = try AutomationRule.string(o["appKey"], "appKey", max: AppKey.maxBytes)
        guard AppKey.isValid(appKey) else { throw AutomationError("appKey", "must be \(AppKey.rule)") }
        guard let list = o["conditions"]?.arrayValue, list.count <= AutomationLimits.maxConditions else {
            throw AutomationError(
                "conditions", "is required: an array of at most \(AutomationLimits.maxConditions) conditions ([] is every user)")
        }
        var conditions: [Condition] = []
        for (i, c) in list.enumerated() { conditions.append(try condition(c, at: "conditions[\(i)]")) }
        return Segment(name: name, appKey: appKey, conditions: conditions)
    }

    private static func condition(_ j: JSON, at path: String) throws(AutomationError) -> Condition {
        let shapes =
            "{\"property\": \"profile.NAME\", \"op\", ...}, {\"identity\": KIND}, {\"pushBinding\": true}, "
            + "{\"did\" | \"didNot\": EVENT, \"atLeast\": N, \"days\": D}"
        guard let o = j.objectValue else { throw AutomationError(path, "must be one of " + shapes) }
        if o["property"] != nil {
            var c = try AutomationRule.condition(j, at: path)
            guard c.property.hasPrefix("profile."), c.property.count > 8 else {
                throw AutomationError(path + ".property", "must be profile.NAME")
            }
            c.property = String(c.property.dropFirst(8))
            return .profile(c)
        }
        if let kind = o["identity"] {
            try AutomationRule.only(o, ["identity", "has"], at: path)
            let kinds = ["user_id", "anonymous_id", "email", "phone", "device"]
            guard let k = kind.stringValue, kinds.contains(k) else {
                throw AutomationError(path + ".identity", "must be one of \(kinds.joined(separator: ", "))")
            }
            return .identity(kind: k, has: try bool(o["has"], path + ".has") ?? true)
        }
        if let b = o["pushBinding"] {
            try AutomationRule.only(o, ["pushBinding"], at: path)
            guard let v = b.boolValue else { throw AutomationError(path + ".pushBinding", "must be a boolean") }
            return .pushBinding(v)
        }
        if o["did"] != nil || o["didNot"] != nil {
            let key = o["did"] != nil ? "did" : "didNot"
            try AutomationRule.only(o, [key, "atLeast", "days"], at: path)
            let event = try AutomationRule.string(o[key], path + "." + key, max: EventIndex.maxFieldBytes)
            func int(_ k: String, _ r: ClosedRange<Int64>, _ def: Int64?) throws(AutomationError) -> Int {
                guard let v = o[k], !v.isNull else {
                    guard let def else {
                        throw AutomationError(path + "." + k, "is required: an integer in \(r.lowerBound)...\(r.upperBound)")
                    }
                    return Int(def)
                }
                guard let n = v.intValue, r.contains(n) else {
                    throw AutomationError(path + "." + k, "must be an integer in \(r.lowerBound)...\(r.upperBound)")
                }
                return Int(n)
            }
            let atLeast = try int("atLeast", 1...AutomationLimits.maxSegmentCount, 1)
            let days = try int("days", 1...AutomationLimits.maxSegmentDays, nil)
            return .did(event: event, atLeast: atLeast, days: days, negate: key == "didNot")
        }
        throw AutomationError(path, "must be one of " + shapes)
    }

    private static func bool(_ j: JSON?, _ path: String) throws(AutomationError) -> Bool? {
        guard let j, !j.isNull else { return nil }
        guard let b = j.boolValue else { throw AutomationError(path, "must be a boolean") }
        return b
    }
}
