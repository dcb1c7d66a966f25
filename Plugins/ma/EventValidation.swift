import CJSONC
import PylonPluginKit

#if canImport(Glibc)
import Glibc
#endif

/// eventRecord's checks (docs/MA.md, `ma.eventRecord`): `eventName` required, non-empty, not starting with `el`; at
/// most 500 properties; property keys start with a lowercase letter and contain only lowercase letters,
/// digits and `_`; every string, keys included, at most 256 UTF-8 bytes (nested values too);
/// every number finite.
///
/// Two walks apply the same rules with the same messages: `check(eventNameRef:propertyRef:)` on
/// a parsed json-c tree, and `checkProperties(text:_:)` on the properties' JSON text (the hot
/// path: nothing is built). `EventParams` decides which one runs; a test of generated requests
/// holds them to the same answers.
enum EventValidation {
    static let maxProperties = 500
    static let maxStringBytes = 256

    static let nameRequired = "eventName is required and must be a string"
    static let propertyNotObject = "property must be an object"
    static func tooManyProperties(_ count: Int) -> String { "property has \(count) entries; at most \(maxProperties)" }
    static func badKey(_ key: UnsafeRawBufferPointer, _ why: String) -> String {
        "property key \"\(String(decoding: key, as: UTF8.self))\": \(why)"
    }
    static func badValue(_ key: UnsafeRawBufferPointer, _ why: String) -> String {
        "property \"\(String(decoding: key, as: UTF8.self))\": \(why)"
    }
    static let stringTooLong = "string longer than \(maxStringBytes) bytes"
    static let notFinite = "numbers must be finite"
    static let keyTooLong = "key longer than \(maxStringBytes) bytes"

    /// nil when valid; else a message naming the offending field.
    static func check(eventName: JSON?, property: JSON?) -> String? {
        let n = eventName.map { JSONRef($0) }
        let p = property.map { JSONRef($0) }
        return check(eventNameRef: n?.ptr, propertyRef: p?.ptr)
    }

    // MARK: Shared rules

    /// The event name's rules, on its bytes (a string).
    static func checkName(_ name: UnsafeRawBufferPointer) -> String? {
        if name.isEmpty { return "eventName must not be empty" }
        if name.count >= 2 && name[0] == 0x65 && name[1] == 0x6C { return "eventName must not start with \"el\"" }
        if name.count > maxStringBytes { return "eventName is longer than \(maxStringBytes) bytes" }
        return nil
    }

    /// A top-level property key's rules, on its bytes.
    static func checkKey(_ k: UnsafeRawBufferPointer) -> String? {
        // ma.md §3: a lowercase letter first, then lowercase letters, digits and `_` (the key
        // contains only those: an uppercase first letter is refused like one later on).
        guard let f = k.first, f >= 0x61 && f <= 0x7A else { return "must start with a lowercase letter" }
        for u in k.dropFirst() {
            guard (u >= 0x61 && u <= 0x7A) || (u >= 0x30 && u <= 0x39) || u == 0x5F else {
                return "only lowercase letters, digits and _ are allowed"
            }
        }
        if k.count > maxStringBytes { return "longer than \(maxStringBytes) bytes" }
        return nil
    }

    // MARK: On a json-c tree

    /// `e` nil (absent) is typed null, so it fails the string check like any non-string.
    static func check(eventNameRef e: OpaquePointer?, propertyRef p: OpaquePointer?) -> String? {
        guard json_object_get_type(e) == json_type_string else { return nameRequired }
        if let why = checkName(UnsafeRawBufferPointer(start: json_object_get_string(e), count: Int(json_object_get_string_len(e)))) {
            return why
        }
        guard let p, json_object_get_type(p) != json_type_null else { return nil }
        guard json_object_get_type(p) == json_type_object else { return propertyNotObject }
        let count = Int(json_object_object_length(p))
        if count > maxProperties { return tooManyProperties(count) }
        var it = json_object_iter_begin(p)
        var end = json_object_iter_end(p)
        while json_object_iter_equal(&it, &end) == 0 {
            // json-c's keys are C strings.
            let kp = json_object_iter_peek_name(&it)!
            let key = UnsafeRawBufferPointer(start: kp, count: strlen(kp))
            if let why = checkKey(key) { return badKey(key, why) }
            if let why = checkValue(json_object_iter_peek_value(&it)) { return badValue(key, why) }
            json_object_iter_next(&it)
        }
        return nil
    }

    static func checkValue(_ v: OpaquePointer?) -> String? {
        switch json_object_get_type(v) {
        case json_type_string:
            return json_object_get_string_len(v) > maxStringBytes ? stringTooLong : nil
        case json_type_double:
            return json_object_get_double(v).isFinite ? nil : notFinite
        case json_type_array:
            for i in 0..<json_object_array_length(v) { if let w = checkValue(json_object_array_get_idx(v, i)) { return w } }
            return nil
        case json_type_object:
            var it = json_object_iter_begin(v)
            var end = json_object_iter_end(v)
            while json_object_iter_equal(&it, &end) == 0 {
                if strlen(json_object_iter_peek_name(&it)) > maxStringBytes { return keyTooLong }
                if let w = checkValue(json_object_iter_peek_value(&it)) { return w }
                json_object_iter_next(&it)
            }
            return nil
        default:
            return nil
        }
    }

    // MARK: On JSON text

    /// What the text walk concluded.
    enum TextOutcome: Equatable {
        case valid
        case invalid(String)
        /// The bytes alone do not say (a key written with an escape): json-c's tree decides.
        case unsure
    }

    /// The property rules on the object at `span` of valid JSON text `t`, in json-c's order
    /// (the entry count first, then each member in turn). The text must be one json-c would
    /// read member for member as written (`RawJSON.jsonCText` is non-nil for it: no repeated
    /// key, no escape but `\" \\ \b \f \n \r \t`, integers within Int64), so that the members
    /// seen here are json-c's, in its order.
    static func checkProperties(text t: UnsafeRawBufferPointer, _ span: Range<Int>) -> TextOutcome {
        var members = RawJSON.MemberCursor(t, span)
        var count = 0
        var first: String?
        while let m = members.nextKey() {
            count += 1
            // After the first failure only the count can change the answer.
            guard first == nil else { continue }
            if m.keyEscaped { return .unsure }
            let key = UnsafeRawBufferPointer(rebasing: t[m.key])
            if let why = checkKey(key) {
                first = badKey(key, why)
                continue
            }
            var walk = ValueWalk(t: t, i: m.valueStart)
            switch walk.value(depth: 0) {
            case .unsure: return .unsure
            case .invalid(let why): first = badValue(key, why)  // the cursor skips the rest of the value
            case .valid: members.resume(at: walk.i)
            }
        }
        if count > maxProperties { return .invalid(tooManyProperties(count)) }
        return first.map { .invalid($0) } ?? .valid
    }

    /// `checkValue` on text: walks one value from `i`, leaving `i` just after it when valid.
    struct ValueWalk {
        let t: UnsafeRawBufferPointer
        var i: Int
        /// Deeper containers are left to json-c (the recursion stays bounded).
        static let maxDepth = 256

        mutating func value(depth: Int) -> TextOutcome {
            i = skipSpace()
            guard i < t.count else { return .unsure }
            switch t[i] {
            case UInt8(ascii: "\""):
                let (decoded, _) = string()
                return decoded > maxStringBytes ? .invalid(stringTooLong) : .valid
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                guard depth < ValueWalk.maxDepth else { return .unsure }
                let keyed = t[i] == UInt8(ascii: "{")
                let close = keyed ? UInt8(ascii: "}") : UInt8(ascii: "]")
                i += 1
                while true {
                    i = skipSpace()
                    guard i < t.count else { return .unsure }
                    if t[i] == close { i += 1; return .valid }
                    if t[i] == UInt8(ascii: ",") { i += 1; continue }
                    if keyed {
                        let (decoded, escaped) = string()
                        if escaped { return .unsure }  // json-c's key is the decoded one
                        if decoded > maxStringBytes { return .invalid(keyTooLong) }
                        i = skipSpace()
                        guard i < t.count, t[i] == UInt8(ascii: ":") else { return .unsure }
                        i += 1
                    }
                    let v = value(depth: depth + 1)
                    guard v == .valid else { return v }
                }
            case UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"):
                while i < t.count, t[i] >= UInt8(ascii: "a"), t[i] <= UInt8(ascii: "z") { i += 1 }
                return .valid
            default:
                let start = i
                var fraction = false
                while i < t.count {
                    let c = t[i]
                    if c == UInt8(ascii: ".") || c == UInt8(ascii: "e") || c == UInt8(ascii: "E") {
                        fraction = true
                    } else if !(c == UInt8(ascii: "-") || c == UInt8(ascii: "+") || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9"))) {
                        break
                    }
                    i += 1
                }
                guard i > start else { return .unsure }
                // An integer is json-c's int (no rule); a fraction or exponent its double, read as
                // json-c reads it (strtod, which stops at the delimiter after the number).
                guard fraction else { return .valid }
                let d = strtod((t.baseAddress! + start).assumingMemoryBound(to: CChar.self), nil)
                return d.isFinite ? .valid : .invalid(notFinite)
            }
        }

        @inline(__always) func skipSpace() -> Int { RawJSON.skipSpace(t, i) }

        /// The string at `i` (its opening quote): its decoded length in bytes, counting each
        /// escape as one byte (only one-character escapes reach here), and whether it had one.
        /// Leaves `i` after the closing quote.
        mutating func string() -> (decoded: Int, escaped: Bool) {
            i += 1
            var n = 0
            var escaped = false
            while i < t.count {
                let c = t[i]
                if c == UInt8(ascii: "\"") { i += 1; break }
                if c == UInt8(ascii: "\\") { escaped = true; i += 2 } else { i += 1 }
                n += 1
            }
            return (n, escaped)
        }
    }
}
