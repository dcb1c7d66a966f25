import PylonPluginKit

/// Local checks of the user-property calls (docs/MA.md, "User properties"). All-or-nothing: any failure is -3 and
/// nothing is sent. The server applies the semantic rules (merge, object_array metadata).
package enum PropertyValidation {
    package static let maxPerCall = 100
    static let maxNameBytes = 50
    static let reservedPrefixes = ["el", "engagelab", "metaverse"]

    package static func checkName(_ k: String) -> String? {
        guard let f = k.unicodeScalars.first, f >= "a" && f <= "z" else {
            return "property name \"\(k)\" must start with a lowercase letter"
        }
        for u in k.unicodeScalars where !((u >= "a" && u <= "z") || (u >= "0" && u <= "9") || u == "_") {
            return "property name \"\(k)\" may contain only a-z, 0-9 and _"
        }
        if k.utf8.count > maxNameBytes { return "property name \"\(k)\" is longer than \(maxNameBytes) bytes" }
        for p in reservedPrefixes where k.hasPrefix(p) { return "property name \"\(k)\" must not start with \"\(p)\"" }
        return nil
    }

    package static func isFiniteNumber(_ v: JSON) -> Bool {
        switch v {
        case .int: return true
        case .double(let d): return d.isFinite
        default: return false
        }
    }

    package static func isStringArray(_ v: JSON) -> Bool {
        guard let a = v.arrayValue else { return false }
        return a.allSatisfy { $0.stringValue != nil }
    }

    /// Subfields of an object or of an object_array element.
    static func checkSubfields(_ o: JSONObject, requireNonNull: Bool, context: String) -> String? {
        if o.isEmpty { return "\(context) must not be empty" }
        var nonNull = 0
        for (k, v) in o {
            if k.isEmpty || k.contains(".") || k.contains("$") {
                return "\(context): subfield name \"\(k)\" must be non-empty without . or $"
            }
            switch v {
            case .string, .null: break
            case .int, .double: if !isFiniteNumber(v) { return "\(context).\(k): numbers must be finite" }
            case .array: if !isStringArray(v) { return "\(context).\(k): arrays may hold only strings" }
            default: return "\(context).\(k): objects cannot be nested"
            }
            if v != .null { nonNull += 1 }
        }
        if requireNonNull && nonNull == 0 { return "\(context) must keep at least one non-null subfield" }
        return nil
    }

    /// A setProperty value: string, finite number, string array, object, object_array; an empty
    /// array is allowed (it clears an existing array). Top-level null is not allowed.
    static func checkValue(_ k: String, _ v: JSON) -> String? {
        switch v {
        case .string: return nil
        case .int, .double: return isFiniteNumber(v) ? nil : "\(k): numbers must be finite"
        case .object(let o): return checkSubfields(o, requireNonNull: false, context: k)
        case .array(let a):
            if a.isEmpty || isStringArray(v) { return nil }
            for (i, e) in a.enumerated() {
                guard let o = e.objectValue else { return "\(k): an array holds only strings, or only objects" }
                if let why = checkSubfields(o, requireNonNull: true, context: "\(k)[\(i)]") { return why }
            }
            return nil
        case .null: return "\(k): null cannot delete a property (use deleteProperty)"
        case .bool: return "\(k): booleans are not a property type"
        }
    }

    /// The two call forms: `{"properties": {...}}`, or `{"key": k, <valueKey>: v}` as a map of one.
    private static func propertyMap(_ p: JSON, valueKey: String) -> JSONObject? {
        if let o = p["properties"]?.objectValue { return o }
        if let k = p["key"]?.stringValue, let v = p[valueKey] { return [k: v] }
        return nil
    }

    /// `{"properties": {...}}` or `{"key": k, "value": v}` → the map to send, or an error.
    package static func setProperties(_ p: JSON) -> Result<JSONObject, MAError> {
        guard let props = propertyMap(p, valueKey: "value") else {
            return .failure(MAError(message: "properties (object) or key and value are required"))
        }
        if props.isEmpty { return .failure(MAError(message: "no properties")) }
        if props.count > maxPerCall { return .failure(MAError(message: "at most \(maxPerCall) properties per call")) }
        for (k, v) in props {
            if let why = checkName(k) ?? checkValue(k, v) { return .failure(MAError(message: why)) }
        }
        return .success(props)
    }

    /// `{key, by}` or `{properties: {k: v}}` for increase/add/remove, with a per-value check.
    package static func keyed(_ p: JSON, _ check: (JSON) -> Bool, what: String) -> Result<JSONObject, MAError> {
        guard let props = propertyMap(p, valueKey: "by") else {
            return .failure(MAError(message: "key and by, or properties, are required"))
        }
        if props.isEmpty || props.count > maxPerCall { return .failure(MAError(message: "1 to \(maxPerCall) properties per call")) }
        for (k, v) in props {
            if let why = checkName(k) { return .failure(MAError(message: why)) }
            if !check(v) { return .failure(MAError(message: "\(k): \(what)")) }
        }
        return .success(props)
    }

    /// The element an update/removeObjectArray call addresses: `key`, `identifierKey`, and an
    /// `identifierValue` that is a string or a finite number.
    package struct ElementTarget {
        var key: String
        var identifierKey: String
        var identifierValue: JSON
        package func body(op: String, _ extra: JSONObject = [:]) -> JSONObject {
            var o: JSONObject = [
                "op": .string(op), "key": .string(key), "identifierKey": .string(identifierKey),
                "identifierValue": identifierValue,
            ]
            for (k, v) in extra { o[k] = v }
            return o
        }
    }

    package static func elementTarget(_ p: JSON) -> Result<ElementTarget, MAError> {
        guard let k = p["key"]?.stringValue, let ik = p["identifierKey"]?.stringValue, !ik.isEmpty else {
            return .failure(MAError(message: "key and identifierKey are required"))
        }
        if let why = checkName(k) { return .failure(MAError(message: why)) }
        guard let iv = p["identifierValue"], identifierValue(iv) else {
            return .failure(MAError(message: "identifierValue must be a string or a finite number"))
        }
        return .success(ElementTarget(key: k, identifierKey: ik, identifierValue: iv))
    }

    static func identifierValue(_ v: JSON?) -> Bool {
        guard let v else { return false }
        if v.stringValue != nil { return true }
        return isFiniteNumber(v)
    }
}
