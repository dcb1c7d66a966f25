import CJSONC
import PylonPluginKit

#if canImport(Glibc)
import Glibc
#endif

/// eventRecord's checks (docs/MA.md, `ma.eventRecord`): `eventName` required, non-empty, not starting with `el`; at
/// most 500 properties; property keys start with a letter and contain only lowercase letters,
/// digits and `_`; every string, keys included, at most 256 UTF-8 bytes (nested values too).
/// Works on the parsed json-c tree, so the hot path converts nothing to Swift values.
enum EventValidation {
    static let maxProperties = 500
    static let maxStringBytes = 256

    /// nil when valid; else a message naming the offending field.
    static func check(eventName: JSON?, property: JSON?) -> String? {
        let n = eventName.map { JSONRef($0) }
        let p = property.map { JSONRef($0) }
        return check(eventNameRef: n?.ptr, propertyRef: p?.ptr)
    }

    /// `e` nil (absent) is typed null, so it fails the string check like any non-string.
    static func check(eventNameRef e: OpaquePointer?, propertyRef p: OpaquePointer?) -> String? {
        guard json_object_get_type(e) == json_type_string else { return "eventName is required and must be a string" }
        let len = Int(json_object_get_string_len(e))
        if len == 0 { return "eventName must not be empty" }
        let name = json_object_get_string(e)!
        if len >= 2 && name[0] == 0x65 && name[1] == 0x6C { return "eventName must not start with \"el\"" }
        if len > maxStringBytes { return "eventName is longer than \(maxStringBytes) bytes" }
        guard let p, json_object_get_type(p) != json_type_null else { return nil }
        guard json_object_get_type(p) == json_type_object else { return "property must be an object" }
        let count = Int(json_object_object_length(p))
        if count > maxProperties { return "property has \(count) entries; at most \(maxProperties)" }
        var it = json_object_iter_begin(p)
        var end = json_object_iter_end(p)
        while json_object_iter_equal(&it, &end) == 0 {
            let kp = json_object_iter_peek_name(&it)!
            if let why = checkKey(kp) { return "property key \"\(String(cString: kp))\": \(why)" }
            if let why = checkValue(json_object_iter_peek_value(&it)) { return "property \"\(String(cString: kp))\": \(why)" }
            json_object_iter_next(&it)
        }
        return nil
    }

    static func checkKey(_ k: UnsafePointer<CChar>) -> String? {
        let f = UInt8(bitPattern: k[0])
        guard (f >= 0x61 && f <= 0x7A) || (f >= 0x41 && f <= 0x5A) else { return "must start with a letter" }
        var i = 1
        while k[i] != 0 {
            let u = UInt8(bitPattern: k[i])
            guard (u >= 0x61 && u <= 0x7A) || (u >= 0x30 && u <= 0x39) || u == 0x5F else {
                return "only lowercase letters, digits and _ are allowed"
            }
            i += 1
        }
        if i > maxStringBytes { return "longer than \(maxStringBytes) bytes" }
        return nil
    }

    static func checkValue(_ v: OpaquePointer?) -> String? {
        switch json_object_get_type(v) {
        case json_type_string:
            return json_object_get_string_len(v) > maxStringBytes ? "string longer than \(maxStringBytes) bytes" : nil
        case json_type_double:
            return json_object_get_double(v).isFinite ? nil : "numbers must be finite"
        case json_type_array:
            for i in 0..<json_object_array_length(v) { if let w = checkValue(json_object_array_get_idx(v, i)) { return w } }
            return nil
        case json_type_object:
            var it = json_object_iter_begin(v)
            var end = json_object_iter_end(v)
            while json_object_iter_equal(&it, &end) == 0 {
                if strlen(json_object_iter_peek_name(&it)) > maxStringBytes { return "key longer than \(maxStringBytes) bytes" }
                if let w = checkValue(json_object_iter_peek_value(&it)) { return w }
                json_object_iter_next(&it)
            }
            return nil
        default:
            return nil
        }
    }
}
