import PylonPluginKit

#if canImport(Glibc)
import Glibc
#endif

/// eventRecord's checks (docs/MA.md, `ma.eventRecord`): `eventName` required, non-empty, not starting with `el`; at
/// most 500 properties; property keys start with a lowercase letter and contain only lowercase letters,
/// digits and `_`; every string, keys included, at most 256 UTF-8 bytes (nested values too);
/// every number finite.
///
/// The rules are applied to the properties' canonical text (`RawJSON.canonical`: no repeated
/// key, so each member is the one a reader keeps), keys and strings decoded: one walk, nothing
/// built (`checkProperties(text:_:)`).
package enum EventValidation {
    package static let maxProperties = 500
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

    /// nil when valid; else a message naming the offending field. The check of params given as
    /// Swift values (tests): their JSON text read by `EventParams`.
    static func check(eventName: JSON?, property: JSON?) -> String? {
        var o = JSONObject()
        if let eventName { o["eventName"] = eventName }
        if let property { o["property"] = property }
        let text = Array(JSON.object(o).serialized.utf8)
        return text.withUnsafeBytes { EventParams.read($0).invalid }
    }

    // MARK: Shared rules

    /// The event name's rules, on its bytes (a string).
    package static func checkName(_ name: UnsafeRawBufferPointer) -> String? {
        if name.isEmpty { return "eventName must not be empty" }
        if name.count >= 2 && name[0] == 0x65 && name[1] == 0x6C { return "eventName must not start with \"el\"" }
        if name.count > maxStringBytes { return "eventName is longer than \(maxStringBytes) bytes" }
        return nil
    }

    /// A top-level property key's rules, on its bytes.
    package static func checkKey(_ k: UnsafeRawBufferPointer) -> String? {
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

    // MARK: On JSON text

    /// The property rules on the object at `span` of canonical JSON text `t` (no repeated key),
    /// in order (each member in turn, then the entry count): nil when valid, else the first
    /// member's message (the count's when there are too many entries).
    static func checkProperties(text t: UnsafeRawBufferPointer, _ span: Range<Int>) -> String? {
        var members = RawJSON.MemberCursor(t, span)
        var count = 0
        var first: String?
        var decoded: [UInt8] = []
        while let m = members.nextKey() {
            count += 1
            // After the first failure only the count can change the answer.
            guard first == nil else { continue }
            var why: String?
            let key = UnsafeRawBufferPointer(rebasing: t[m.key])
            if m.keyEscaped {
                decoded = RawJSON.decode(t, m.key)
                why = decoded.withUnsafeBytes { b in checkKey(b).map { badKey(b, $0) } }
            } else if let w = checkKey(key) {
                why = badKey(key, w)
            }
            if let why {
                first = why
                continue
            }
            var walk = ValueWalk(t: t, i: m.valueStart)
            if let w = walk.value(depth: 0) {
                first = m.keyEscaped ? decoded.withUnsafeBytes { badValue($0, w) } : badValue(key, w)
            } else {
                members.resume(at: walk.i)
            }
        }
        if count > maxProperties { return tooManyProperties(count) }
        return first
    }

    /// The value rules on text: walks one value from `i` (canonical text), leaving `i` just after
    /// it when valid; nil when valid, else why not.
    struct ValueWalk {
        let t: UnsafeRawBufferPointer
        var i: Int
        /// Containers nested deeper than this are refused (the walk recurses).
        static let maxDepth = 256
        static let tooDeep = "nested deeper than \(maxDepth) levels"

        mutating func value(depth: Int) -> String? {
            guard i < t.count else { return nil }
            switch t[i] {
            case UInt8(ascii: "\""):
                return string() > maxStringBytes ? stringTooLong : nil
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                guard depth < ValueWalk.maxDepth else { return ValueWalk.tooDeep }
                let keyed = t[i] == UInt8(ascii: "{")
                let close = keyed ? UInt8(ascii: "}") : UInt8(ascii: "]")
                i += 1
                while i < t.count {
                    if t[i] == close { i += 1; return nil }
                    if t[i] == UInt8(ascii: ",") { i += 1; continue }
                    if keyed {
                        if string() > maxStringBytes { return keyTooLong }
                        i += 1  // the colon (canonical text: no whitespace)
                    }
                    if let w = value(depth: depth + 1) { return w }
                }
                return nil
            case UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"):
                while i < t.count, t[i] >= UInt8(ascii: "a"), t[i] <= UInt8(ascii: "z") { i += 1 }
                return nil
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
                if i == start { i += 1 }  // not JSON (canonical text never gets here): keep moving
                // An integer has no rule; a fraction or exponent is a double (strtod, which stops
                // at the delimiter after the number), refused when not finite.
                guard fraction else { return nil }
                let d = strtod((t.baseAddress! + start).assumingMemoryBound(to: CChar.self), nil)
                return d.isFinite ? nil : notFinite
            }
        }

        /// The string at `i` (its opening quote): its decoded length in bytes. Leaves `i` after
        /// the closing quote.
        mutating func string() -> Int {
            let end = RawJSON.skipString(t, i)
            let body = (i + 1)..<max(i + 1, end - 1)
            i = end
            guard RawJSON.contains(t, body, UInt8(ascii: "\\")) else { return body.count }
            return RawJSON.decode(t, body).count
        }
    }
}
