import PylonPluginKit

/// eventRecord's checks (ma.md §3): `eventName` required, non-empty, not starting with `el`; at
/// most 500 properties; property keys start with a letter and contain only lowercase letters,
/// digits and `_`; every string, keys included, at most 256 UTF-8 bytes (nested values too).
enum EventValidation {
    static let maxProperties = 500
    static let maxStringBytes = 256

    /// nil when valid; else a message naming the offending field.
    static func check(eventName: JSON?, property: JSON?) -> String? {
        guard let name = eventName?.stringValue else { return "eventName is required and must be a string" }
        if name.isEmpty { return "eventName must not be empty" }
        if name.hasPrefix("el") { return "eventName must not start with \"el\"" }
        if name.utf8.count > maxStringBytes { return "eventName is longer than \(maxStringBytes) bytes" }
        guard let property else { return nil }
        if property == .null { return nil }
        guard let props = property.objectValue else { return "property must be an object" }
        if props.count > maxProperties { return "property has \(props.count) entries; at most \(maxProperties)" }
        for (k, v) in props {
            if let why = checkKey(k) { return "property key \"\(k)\": \(why)" }
            if let why = checkValue(v) { return "property \"\(k)\": \(why)" }
        }
        return nil
    }

    static func checkKey(_ k: String) -> String? {
        guard let f = k.unicodeScalars.first, (f >= "a" && f <= "z") || (f >= "A" && f <= "Z") else {
            return "must start with a letter"
        }
        for u in k.unicodeScalars.dropFirst() where !((u >= "a" && u <= "z") || (u >= "0" && u <= "9") || u == "_") {
            return "only lowercase letters, digits and _ are allowed"
        }
        if k.utf8.count > maxStringBytes { return "longer than \(maxStringBytes) bytes" }
        return nil
    }

    static func checkValue(_ v: JSON) -> String? {
        switch v {
        case .string(let s): return s.utf8.count > maxStringBytes ? "string longer than \(maxStringBytes) bytes" : nil
        case .array(let a):
            for x in a { if let w = checkValue(x) { return w } }
            return nil
        case .object(let o):
            for (k, x) in o {
                if k.utf8.count > maxStringBytes { return "key longer than \(maxStringBytes) bytes" }
                if let w = checkValue(x) { return w }
            }
            return nil
        case .double(let d): return d.isFinite ? nil : "numbers must be finite"
        default: return nil
        }
    }
}
