import CJSONC

/// Owns one reference to a json-c `json_object` (released with `json_object_put` on deinit).
/// The hot routing path works on these directly so it never converts whole messages to Swift values.
public final class JSONRef {
    public let ptr: OpaquePointer?

    /// Takes ownership of one reference.
    public init(owning ptr: OpaquePointer?) { self.ptr = ptr }
    /// Adds a reference (`json_object_get`).
    public init(retaining ptr: OpaquePointer?) { self.ptr = json_object_get(ptr) }
    deinit { json_object_put(ptr) }

    public convenience init(_ value: JSON) { self.init(owning: JSONRef.make(value)) }

    /// Builds a new json-c object tree; the caller owns the returned reference.
    public static func make(_ value: JSON) -> OpaquePointer? {
        switch value {
        case .null: return nil
        case .bool(let b): return json_object_new_boolean(b ? 1 : 0)
        case .int(let i): return json_object_new_int64(i)
        case .double(let d):
            // Shortest text that round-trips (Swift's), instead of json-c's 17 digits.
            guard d.isFinite else { return nil }
            return json_object_new_double_s(d, d.description)
        case .string(let s):
            var s = s
            return s.withUTF8 { b in
                b.withMemoryRebound(to: CChar.self) { json_object_new_string_len($0.baseAddress, Int32($0.count)) }
            }
        case .array(let a):
            let arr = json_object_new_array_ext(Int32(a.count))
            for v in a { json_object_array_add(arr, make(v)) }
            return arr
        case .object(let o):
            let obj = json_object_new_object()
            for (k, v) in o { json_object_object_add(obj, k, make(v)) }
            return obj
        }
    }

    /// Converts a borrowed json-c object into a Swift value.
    public static func toJSON(_ p: OpaquePointer?) -> JSON {
        guard let p else { return .null }
        switch json_object_get_type(p) {
        case json_type_null: return .null
        case json_type_boolean: return .bool(json_object_get_boolean(p) != 0)
        case json_type_int: return .int(json_object_get_int64(p))
        case json_type_double: return .double(json_object_get_double(p))
        case json_type_string:
            let n = Int(json_object_get_string_len(p))
            guard let c = json_object_get_string(p) else { return .string("") }
            return .string(
                String(decoding: UnsafeRawBufferPointer(start: c, count: n), as: UTF8.self))
        case json_type_array:
            let n = json_object_array_length(p)
            var out: [JSON] = []
            out.reserveCapacity(n)
            for i in 0..<n { out.append(toJSON(json_object_array_get_idx(p, i))) }
            return .array(out)
        case json_type_object:
            var o = JSONObject()
            var it = json_object_iter_begin(p)
            var end = json_object_iter_end(p)
            while json_object_iter_equal(&it, &end) == 0 {
                let name = String(cString: json_object_iter_peek_name(&it))
                o[name] = toJSON(json_object_iter_peek_value(&it))
                json_object_iter_next(&it)
            }
            return .object(o)
        default: return .null
        }
    }

    public var json: JSON { JSONRef.toJSON(ptr) }

    /// Borrowed member of an object (nil when absent or not an object).
    public func member(_ key: String) -> OpaquePointer? {
        var out: OpaquePointer? = nil
        guard json_object_get_type(ptr) == json_type_object,
            json_object_object_get_ex(ptr, key, &out) != 0
        else { return nil }
        return out
    }
    public func has(_ key: String) -> Bool {
        guard json_object_get_type(ptr) == json_type_object else { return false }
        return json_object_object_get_ex(ptr, key, nil) != 0
    }

    /// Calls `body` with the compact serialisation (no newline); the bytes are valid only inside.
    public func withSerialized<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        var len = 0
        guard let c = json_object_to_json_string_length(ptr, flagsPlain, &len) else {
            return "null".utf8CString.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0.dropLast())) }
        }
        return body(UnsafeRawBufferPointer(start: c, count: len))
    }
    public var serialized: String {
        withSerialized { String(decoding: $0, as: UTF8.self) }
    }
    /// Indented for a person (json-c's `JSON_C_TO_STRING_PRETTY`, two spaces), slashes unescaped.
    public var prettySerialized: String {
        var len = 0
        let flags = JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE
        guard let c = json_object_to_json_string_length(ptr, flags, &len) else { return "null" }
        return String(decoding: UnsafeRawBufferPointer(start: c, count: len), as: UTF8.self)
    }

    /// Parses exactly one JSON text occupying all of `bytes` (surrounding whitespace allowed).
    public static func parse(_ bytes: UnsafeRawBufferPointer, maxDepth: Int32 = 64) throws(JSONParseError) -> JSONRef {
        let tok = Tokener(maxDepth: maxDepth)
        return try tok.parse(bytes)
    }
}

/// json-c serialisation flags: compact, and "/" not escaped.
public let flagsPlain: Int32 = JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE

/// A reusable json-c tokener configured strictly: UTF-8 validated, a fixed depth limit.
public final class Tokener {
    private let tok: UnsafeMutablePointer<json_tokener>
    public let maxDepth: Int32

    public init(maxDepth: Int32) {
        self.maxDepth = maxDepth
        tok = json_tokener_new_ex(maxDepth)!
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS | JSON_TOKENER_VALIDATE_UTF8)
    }
    deinit { json_tokener_free(tok) }

    /// Parses one complete JSON text from `bytes`. Whitespace may surround it; nothing else may.
    public func parse(_ bytes: UnsafeRawBufferPointer) throws(JSONParseError) -> JSONRef {
        json_tokener_reset(tok)
        guard let base = bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count > 0 else {
            throw JSONParseError(kind: .incomplete, detail: "empty input")
        }
        var obj = json_tokener_parse_ex(tok, base, Int32(bytes.count))
        var err = json_tokener_get_error(tok)
        var consumedAll = false
        if err == json_tokener_continue {
            consumedAll = true
            // A bare scalar (`42`) needs a terminator to be complete.
            obj = json_tokener_parse_ex(tok, " ", 1)
            err = json_tokener_get_error(tok)
        }
        switch err {
        case json_tokener_success:
            let end = consumedAll ? bytes.count : Int(json_tokener_get_parse_end(tok))
            if end < bytes.count {
                for i in end..<bytes.count where !isSpace(bytes[i]) {
                    json_object_put(obj)
                    throw JSONParseError(kind: .trailing, detail: "unexpected data after the JSON value at byte \(i)")
                }
            }
            return JSONRef(owning: obj)
        case json_tokener_continue:
            throw JSONParseError(kind: .incomplete, detail: "incomplete JSON text")
        case json_tokener_error_depth:
            throw JSONParseError(kind: .depth, detail: "JSON nested deeper than \(maxDepth) levels")
        case json_tokener_error_parse_utf8_string:
            throw JSONParseError(kind: .utf8, detail: "invalid UTF-8 in JSON text")
        default:
            let msg = String(cString: json_tokener_error_desc(err))
            throw JSONParseError(kind: .syntax, detail: "\(msg) at byte \(json_tokener_get_parse_end(tok))")
        }
    }
}

@usableFromInline @inline(__always) func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x0A || b == 0x0D || b == 0x09 }
