#if canImport(Glibc)
import Glibc
#endif

/// Byte-level helpers for text that json-c has already validated as one JSON object.
///
/// Routing rewrites only a message's `id`. Instead of re-serialising the whole parsed object,
/// the host finds the byte span of the top-level `"id"` value and splices a new value in, so a
/// message is parsed once (for validation and routing) and never re-serialised.
public enum RawJSON {
    /// The byte range of the value of top-level member `key` in a validated JSON object, or nil.
    /// `key` must be plain ASCII without escapes. Nested objects and strings are skipped. When the
    /// key appears more than once the last wins, as in json-c, so the bytes rewritten are the
    /// ones the parser used. A key spelled with escapes is not found (callers fall back).
    public static func memberValueSpan(_ text: UnsafeRawBufferPointer, key: StaticString) -> Range<Int>? {
        memberValueSpan(text, keyBytes: UnsafeRawBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
    }

    /// `memberValueSpan` for a key known only at run time (plain, no escapes).
    public static func memberValueSpan(_ text: UnsafeRawBufferPointer, key: String) -> Range<Int>? {
        var key = key
        return key.withUTF8 { memberValueSpan(text, keyBytes: UnsafeRawBufferPointer($0)) }
    }

    static func memberValueSpan(_ text: UnsafeRawBufferPointer, keyBytes key: UnsafeRawBufferPointer) -> Range<Int>? {
        let n = text.count
        var i = 0
        var found: Range<Int>?
        while i < n, text[i] != UInt8(ascii: "{") { i += 1 }
        i += 1
        while i < n {
            i = skipSpace(text, i)
            guard i < n else { return found }
            if text[i] == UInt8(ascii: "}") { return found }
            if text[i] == UInt8(ascii: ",") { i += 1; continue }
            // A key.
            guard text[i] == UInt8(ascii: "\"") else { return found }
            let keyStart = i + 1
            let keyEnd = skipString(text, i) - 1  // index of the closing quote
            i = keyEnd + 1
            i = skipSpace(text, i)
            guard i < n, text[i] == UInt8(ascii: ":") else { return found }
            i = skipSpace(text, i + 1)
            let valueStart = i
            let valueEnd = skipValue(text, i)
            if equals(text, keyStart, keyEnd, key) {
                var e = valueEnd
                while e > valueStart, isSpace(text[e - 1]) { e -= 1 }
                found = valueStart..<e
            }
            i = valueEnd
        }
        return found
    }

    /// The index of the first byte at or after `i` that is not JSON whitespace (or `t.count`).
    @inlinable @inline(__always) public static func skipSpace(_ t: UnsafeRawBufferPointer, _ i: Int) -> Int {
        var i = i
        while i < t.count, isSpace(t[i]) { i += 1 }
        return i
    }

    /// `i` at an opening quote; returns the index after the closing quote.
    public static func skipString(_ t: UnsafeRawBufferPointer, _ i: Int) -> Int {
        var i = i + 1
        while i < t.count {
            i = skipPlain(t, i, stopAtControl: false)
            guard i < t.count else { break }
            let c = t[i]
            if c == UInt8(ascii: "\\") { i += 2; continue }
            if c == UInt8(ascii: "\"") { return i + 1 }
            i += 1
        }
        return t.count
    }

    /// The index of the first quote or backslash from `i` on (with `stopAtControl`, also of the
    /// first control character or byte of 0x80 and above), looking 8 bytes at a time; when fewer
    /// than 8 bytes remain, the index where that begins (the caller goes on byte by byte). The
    /// bytes before it are plain string content: string bodies are most of a message's bytes.
    /// (The word tests flag bytes exactly up to the first match, so its position is exact.)
    @inline(__always)
    static func skipPlain(_ t: UnsafeRawBufferPointer, _ i: Int, stopAtControl: Bool) -> Int {
        guard let base = t.baseAddress else { return i }
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        var i = i
        while i &+ 8 <= t.count {
            let w = UInt64(littleEndian: (base + i).loadUnaligned(as: UInt64.self))
            let q = w ^ (ones &* 0x22)
            let b = w ^ (ones &* 0x5C)
            // A zero byte in `q` or `b` (quote or backslash); below 0x20 or 0x80 and above.
            var hit = ((q &- ones) & ~q) | ((b &- ones) & ~b)
            if stopAtControl { hit |= ((w &- ones &* 0x20) & ~w) | w }
            hit &= highs
            if hit != 0 { return i &+ hit.trailingZeroBitCount &>> 3 }
            i &+= 8
        }
        return i
    }

    /// Returns the index just after the value starting at `i` (before a following `,` or `}`).
    static func skipValue(_ t: UnsafeRawBufferPointer, _ i: Int) -> Int {
        var i = i
        var depth = 0
        while i < t.count {
            let c = t[i]
            switch c {
            case UInt8(ascii: "\""):
                i = skipString(t, i)
                if depth == 0 { return i }
                continue
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if depth == 0 { return i }
                depth -= 1
                if depth == 0 { return i + 1 }
            case UInt8(ascii: ","):
                if depth == 0 { return i }
            default:
                break
            }
            i += 1
        }
        return i
    }

    /// The string at `span` when it is a JSON string without escapes (its bytes are then the
    /// value); nil for any other value, or a string with escapes.
    public static func plainString(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> String? {
        guard span.count >= 2, t[span.lowerBound] == UInt8(ascii: "\""), t[span.upperBound - 1] == UInt8(ascii: "\"") else { return nil }
        let body = UnsafeRawBufferPointer(rebasing: t[(span.lowerBound + 1)..<(span.upperBound - 1)])
        guard !body.contains(UInt8(ascii: "\\")) else { return nil }
        return String(decoding: body, as: UTF8.self)
    }

    /// Whether a value starting with byte `c` is a number.
    public static func isNumber(_ c: UInt8) -> Bool {
        c == UInt8(ascii: "-") || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9"))
    }

    /// Whether the number at `span` has a fraction or an exponent (json-c reads it as a double).
    public static func isFraction(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> Bool {
        span.contains { t[$0] == UInt8(ascii: ".") || t[$0] == UInt8(ascii: "e") || t[$0] == UInt8(ascii: "E") }
    }

    /// The integer at `span` when it is written as plain digits (optionally negative) that fit an
    /// Int64; nil for anything else (fractions, exponents, strings, overflow).
    public static func plainInt(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> Int64? {
        var i = span.lowerBound
        let negative = i < span.upperBound && t[i] == UInt8(ascii: "-")
        if negative { i += 1 }
        guard i < span.upperBound else { return nil }
        var v: Int64 = 0
        while i < span.upperBound {
            let c = t[i]
            guard c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") else { return nil }
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (a, o2) = m.addingReportingOverflow(Int64(c - UInt8(ascii: "0")))
            guard !o1, !o2 else { return nil }
            v = a
            i += 1
        }
        return negative ? -v : v
    }

    /// The integers of the array at `span` when it holds plain integers only (`[1, 2]`: each as
    /// `plainInt` reads it), in order; nil for anything else. `t` is validated JSON.
    public static func intArray(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> [Int64]? {
        var i = skipSpace(t, span.lowerBound)
        guard i < span.upperBound, t[i] == UInt8(ascii: "[") else { return nil }
        var out: [Int64] = []
        i = skipSpace(t, i + 1)
        if i < span.upperBound, t[i] == UInt8(ascii: "]") { return out }
        while i < span.upperBound {
            var e = i
            while e < span.upperBound, isNumber(t[e]) { e += 1 }
            guard let n = plainInt(t, i..<e) else { return nil }
            out.append(n)
            i = skipSpace(t, e)
            guard i < span.upperBound else { return nil }
            if t[i] == UInt8(ascii: "]") { return out }
            guard t[i] == UInt8(ascii: ",") else { return nil }
            i = skipSpace(t, i + 1)
        }
        return nil
    }

    /// Whether bytes `s..<e` of `t` are exactly `key`.
    @inline(__always) public static func equals(_ t: UnsafeRawBufferPointer, _ s: Int, _ e: Int, _ key: StaticString) -> Bool {
        equals(t, s, e, UnsafeRawBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
    }

    @inline(__always) static func equals(_ t: UnsafeRawBufferPointer, _ s: Int, _ e: Int, _ key: UnsafeRawBufferPointer) -> Bool {
        e - s == key.count && (key.isEmpty || memcmp(t.baseAddress! + s, key.baseAddress!, key.count) == 0)
    }
}

// MARK: - One-pass validation of a message line

/// Byte spans of the top-level members of a JSON-RPC message (value bytes, no surrounding
/// whitespace). When a key repeats, the last one wins, as in json-c.
public struct MessageSpans: Equatable, Sendable {
    public var jsonrpc: Range<Int>?
    public var id: Range<Int>?
    public var method: Range<Int>?
    public var params: Range<Int>?
    public var result: Range<Int>?
    public var error: Range<Int>?
    /// `_pylon`: caller information, written by the host only (a sender's own is refused).
    public var pylon: Range<Int>?
    /// `_onBehalfOf`: the host-issued id of the request a plugin is serving when it calls for it.
    public var onBehalfOf: Range<Int>?
    /// `_answers`: requests a plugin is serving that the host answers once this call succeeds
    /// (docs/PROTOCOL.md "Answers on success").
    public var answers: Range<Int>?
    public init() {}

    /// Records `span` as the value of the member whose key is `t[keyStart..<keyEnd]` (raw key
    /// bytes, no escapes), if it is one of the members above. The one list of them, for every
    /// scanner of a message line. Returns the member's name when it already had a value (a
    /// repeated routing member; the last one is kept).
    @discardableResult @inline(__always)
    mutating func assign(_ t: UnsafeRawBufferPointer, key keyStart: Int, _ keyEnd: Int, _ span: Range<Int>) -> StaticString? {
        assign(name: UnsafeRawBufferPointer(rebasing: t[keyStart..<keyEnd]), span)
    }

    /// `assign` for a key written with escapes: `t[key]` (the bytes between its quotes) decoded
    /// first, so `"\u0069d"` is `id` (docs/PROTOCOL.md, "Canonical form"). Allocates; only keys
    /// with a backslash come here.
    @discardableResult
    mutating func assign(_ t: UnsafeRawBufferPointer, escapedKey key: Range<Int>, _ span: Range<Int>) -> StaticString? {
        RawJSON.decode(t, key).withUnsafeBytes { assign(name: $0, span) }
    }

    @inline(__always) private mutating func assign(name k: UnsafeRawBufferPointer, _ span: Range<Int>) -> StaticString? {
        @inline(__always) func set(_ member: inout Range<Int>?, _ name: StaticString) -> StaticString? {
            defer { member = span }
            return member == nil ? nil : name
        }
        let n = k.count
        switch n {
        case 2 where RawJSON.equals(k, 0, n, "id"): return set(&id, "id")
        case 5 where RawJSON.equals(k, 0, n, "error"): return set(&error, "error")
        case 6 where RawJSON.equals(k, 0, n, "method"): return set(&method, "method")
        case 6 where RawJSON.equals(k, 0, n, "params"): return set(&params, "params")
        case 6 where RawJSON.equals(k, 0, n, "result"): return set(&result, "result")
        case 6 where RawJSON.equals(k, 0, n, "_pylon"): return set(&pylon, "_pylon")
        case 11 where RawJSON.equals(k, 0, n, "_onBehalfOf"): return set(&onBehalfOf, "_onBehalfOf")
        case 8 where RawJSON.equals(k, 0, n, "_answers"): return set(&answers, "_answers")
        case 7 where RawJSON.equals(k, 0, n, "jsonrpc"): return set(&jsonrpc, "jsonrpc")
        default: return nil
        }
    }
}

extension RawJSON {
    /// What the one-pass scan concluded about a line. The scan decides every line itself (as
    /// `validate` does); json-c only builds trees of lines it accepted.
    public enum ScanOutcome: Equatable, Sendable {
        /// One valid object (RFC 8259, strictly): the spans of its members, keys decoded.
        case message(MessageSpans)
        /// Not strict JSON (RFC 8259); `at` is the byte where the scan stopped.
        case invalid(at: Int)
        /// Containers nested deeper than `maxDepth` (as json-c counts levels, see `validate`).
        case tooDeep
        /// Valid, but a member name somewhere holds U+0000 (json-c cuts keys there, other
        /// parsers do not: the host and a plugin would read different members).
        case nulKey
        /// Valid, but a top-level routing member (`MessageSpans`' list) is written more than
        /// once, however its keys are spelled: receivers that keep the first would read another
        /// id, method or params than the host checked.
        case repeated(member: String)
        /// Valid JSON that is not an object at the top (a batch, or a scalar).
        case notObject
    }

    /// Validates `text` as one JSON text (RFC 8259, strictly: UTF-8, no control characters in
    /// strings, no leading zeros, nothing but whitespace around it) nested at most `maxDepth`
    /// levels (as `validate` counts them), and, when it is an object, returns the spans of its
    /// JSON-RPC members — in one pass, building nothing (a top-level key with escapes is
    /// decoded to be named).
    public static func classifyMessage(_ text: UnsafeRawBufferPointer, maxDepth: Int) -> ScanOutcome {
        var s = Scanner(t: text, maxDepth: maxDepth)
        if let m = s.message() {
            if s.nulKey { return .nulKey }
            if let r = s.repeated { return .repeated(member: r.description) }
            return .message(m)
        }
        if s.notObject {
            s = Scanner(t: text, maxDepth: maxDepth)
            if s.document() { return .notObject }
        }
        return s.tooDeep ? .tooDeep : .invalid(at: min(s.i, text.count))
    }

    struct Scanner {
        let t: UnsafeRawBufferPointer
        let maxDepth: Int
        var i = 0
        /// Set when `message` stopped because the text is not an object at the top.
        var notObject = false
        /// Set when the scan stopped at a container nested beyond `maxDepth`.
        var tooDeep = false
        /// Set when the last string scanned held the escape `\u0000`.
        var sawNUL = false
        /// Set when a key anywhere held U+0000 (`validate` does not mind; the host refuses).
        var nulKey = false
        /// The first top-level routing member written twice (`message`).
        var repeated: StaticString?

        init(t: UnsafeRawBufferPointer, maxDepth: Int) {
            self.t = t
            self.maxDepth = maxDepth
        }

        /// One JSON text: a value with nothing but whitespace around it (`validate`).
        mutating func document() -> Bool {
            ws()
            guard value(depth: 0) else { return false }
            ws()
            return i == t.count
        }

        @inline(__always) mutating func ws() { i = RawJSON.skipSpace(t, i) }

        mutating func message() -> MessageSpans? {
            var spans = MessageSpans()
            ws()
            guard i < t.count, t[i] == UInt8(ascii: "{") else { notObject = true; return nil }
            guard maxDepth >= 1 else { tooDeep = true; return nil }
            i += 1
            ws()
            if i < t.count, t[i] == UInt8(ascii: "}") {
                i += 1
            } else {
                while true {
                    ws()
                    guard i < t.count, t[i] == UInt8(ascii: "\"") else { return nil }
                    let keyStart = i + 1
                    guard let escaped = string() else { return nil }
                    let keyEnd = i - 1
                    if escaped, sawNUL { nulKey = true }
                    ws()
                    guard i < t.count, t[i] == UInt8(ascii: ":") else { return nil }
                    i += 1
                    ws()
                    let valueStart = i
                    guard value(depth: 1) else { return nil }
                    let span = valueStart..<i
                    let again =
                        escaped ? spans.assign(t, escapedKey: keyStart..<keyEnd, span) : spans.assign(t, key: keyStart, keyEnd, span)
                    if let again, repeated == nil { repeated = again }
                    ws()
                    guard i < t.count else { return nil }
                    if t[i] == UInt8(ascii: ",") { i += 1; continue }
                    guard t[i] == UInt8(ascii: "}") else { return nil }
                    i += 1
                    break
                }
            }
            ws()
            return i == t.count ? spans : nil
        }

        /// A value starting at `i`, inside `depth` levels of containers.
        mutating func value(depth: Int) -> Bool {
            guard i < t.count else { return false }
            // A scalar inside `depth` containers is a level of its own, as json-c counts them
            // (`[[0]]` is 3 levels, `[[]]` 2).
            if depth >= maxDepth, t[i] != UInt8(ascii: "{"), t[i] != UInt8(ascii: "[") {
                tooDeep = true
                return false
            }
            switch t[i] {
            case UInt8(ascii: "\""): return string() != nil
            case UInt8(ascii: "{"): return container(depth: depth + 1, close: UInt8(ascii: "}"), keyed: true)
            case UInt8(ascii: "["): return container(depth: depth + 1, close: UInt8(ascii: "]"), keyed: false)
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            default: return false
            }
        }

        mutating func container(depth: Int, close: UInt8, keyed: Bool) -> Bool {
            guard depth <= maxDepth else {
                tooDeep = true
                return false
            }
            i += 1
            ws()
            if i < t.count, t[i] == close { i += 1; return true }
            while true {
                ws()
                if keyed {
                    guard i < t.count, t[i] == UInt8(ascii: "\""), let escaped = string() else { return false }
                    // json-c cuts a key at U+0000, other parsers do not (the host refuses such keys).
                    if escaped, sawNUL { nulKey = true }
                    ws()
                    guard i < t.count, t[i] == UInt8(ascii: ":") else { return false }
                    i += 1
                    ws()
                }
                guard value(depth: depth) else { return false }
                ws()
                guard i < t.count else { return false }
                if t[i] == UInt8(ascii: ",") { i += 1; continue }
                guard t[i] == close else { return false }
                i += 1
                return true
            }
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let n = word.utf8CodeUnitCount
            guard i + n <= t.count, RawJSON.equals(t, i, i + n, word) else { return false }
            i += n
            return true
        }

        mutating func number() -> Bool {
            @inline(__always) func digit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }
            if t[i] == UInt8(ascii: "-") { i += 1 }
            guard i < t.count, digit(t[i]) else { return false }
            if t[i] == UInt8(ascii: "0") {
                i += 1
            } else {
                while i < t.count, digit(t[i]) { i += 1 }
            }
            if i < t.count, t[i] == UInt8(ascii: ".") {
                i += 1
                guard i < t.count, digit(t[i]) else { return false }
                while i < t.count, digit(t[i]) { i += 1 }
            }
            if i < t.count, t[i] == UInt8(ascii: "e") || t[i] == UInt8(ascii: "E") {
                i += 1
                if i < t.count, t[i] == UInt8(ascii: "+") || t[i] == UInt8(ascii: "-") { i += 1 }
                guard i < t.count, digit(t[i]) else { return false }
                while i < t.count, digit(t[i]) { i += 1 }
            }
            // json-c reads a number up to the next delimiter; anything glued on is an error.
            return i == t.count || isDelimiter(t[i])
        }

        @inline(__always) func isDelimiter(_ c: UInt8) -> Bool {
            isSpace(c) || c == UInt8(ascii: ",") || c == UInt8(ascii: "}") || c == UInt8(ascii: "]")
        }

        /// A string at `i` (an opening quote). Returns whether it held an escape, or nil when it
        /// is invalid (bad escape, control character, invalid UTF-8, unterminated).
        mutating func string() -> Bool? {
            i += 1
            var escaped = false
            sawNUL = false
            while i < t.count {
                i = RawJSON.skipPlain(t, i, stopAtControl: true)
                guard i < t.count else { return nil }
                let c = t[i]
                if c == UInt8(ascii: "\"") { i += 1; return escaped }
                if c == UInt8(ascii: "\\") {
                    escaped = true
                    i += 1
                    guard i < t.count else { return nil }
                    switch t[i] {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                        UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                        i += 1
                    case UInt8(ascii: "u"):
                        guard i + 4 < t.count else { return nil }
                        for k in 1...4 where !isHex(t[i + k]) { return nil }
                        // Surrogates are grammar like any `\u` (a lone half decodes to U+FFFD).
                        if t[i + 1] == UInt8(ascii: "0"), t[i + 2] == UInt8(ascii: "0"), t[i + 3] == UInt8(ascii: "0"),
                            t[i + 4] == UInt8(ascii: "0")
                        {
                            sawNUL = true
                        }
                        i += 5
                    default:
                        return nil
                    }
                    continue
                }
                if c < 0x20 { return nil }
                if c < 0x80 { i += 1; continue }
                guard utf8() else { return nil }
            }
            return nil
        }

        @inline(__always) func isHex(_ c: UInt8) -> Bool {
            (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f"))
                || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "F"))
        }

        /// One multi-byte UTF-8 sequence at `i` (well-formed: no overlongs, surrogates or values
        /// above U+10FFFF).
        mutating func utf8() -> Bool {
            let c = t[i]
            @inline(__always) func cont(_ k: Int, _ lo: UInt8 = 0x80, _ hi: UInt8 = 0xBF) -> Bool {
                i + k < t.count && t[i + k] >= lo && t[i + k] <= hi
            }
            switch c {
            case 0xC2...0xDF: guard cont(1) else { return false }; i += 2
            case 0xE0: guard cont(1, 0xA0), cont(2) else { return false }; i += 3
            case 0xE1...0xEC, 0xEE, 0xEF: guard cont(1), cont(2) else { return false }; i += 3
            case 0xED: guard cont(1, 0x80, 0x9F), cont(2) else { return false }; i += 3
            case 0xF0: guard cont(1, 0x90), cont(2), cont(3) else { return false }; i += 4
            case 0xF1...0xF3: guard cont(1), cont(2), cont(3) else { return false }; i += 4
            case 0xF4: guard cont(1, 0x80, 0x8F), cont(2), cont(3) else { return false }; i += 4
            default: return false
            }
            return true
        }
    }
}

extension RawJSON {
    /// The first key that appears twice in one object anywhere in `text` (JSON that json-c
    /// accepted), or nil. json-c keeps the last of duplicate keys silently; files the host reads
    /// (configuration, consent) are refused instead. Keys are compared as written, so two
    /// spellings of one key with escapes are not detected.
    public static func duplicateKey(in text: UnsafeRawBufferPointer) -> String? {
        var seen: [Int: Set<[UInt8]>] = [:]
        var found: String?
        forEachKey(in: text) { key, object in
            let k = Array(text[key])
            guard seen[object, default: []].insert(k).inserted else {
                found = String(decoding: k, as: UTF8.self)
                return false
            }
            return true
        }
        return found
    }

    /// Calls `visit` with every object key in `text` (JSON that json-c accepted, nested at most
    /// 1024 levels), as written between its quotes, and the index of the object's `{` (which
    /// object it is in), depth first in text order, until `visit` returns false.
    static func forEachKey(in text: UnsafeRawBufferPointer, _ visit: (_ key: Range<Int>, _ object: Int) -> Bool) {
        var i = skipSpace(text, 0)
        _ = forEachKey(text, &i, depth: 0, visit)
    }

    /// Returns false once `visit` did.
    private static func forEachKey(
        _ t: UnsafeRawBufferPointer, _ i: inout Int, depth: Int, _ visit: (_ key: Range<Int>, _ object: Int) -> Bool
    ) -> Bool {
        guard i < t.count, depth < 1024 else { return true }
        let open = t[i]
        guard open == UInt8(ascii: "{") || open == UInt8(ascii: "[") else {
            i = skipValue(t, i)
            return true
        }
        let object = i
        let close = open == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
        i += 1
        while true {
            i = skipSpace(t, i)
            guard i < t.count else { return true }
            if t[i] == close { i += 1; return true }
            if t[i] == UInt8(ascii: ",") { i += 1; continue }
            if open == UInt8(ascii: "{") {
                guard t[i] == UInt8(ascii: "\"") else { return true }
                let end = skipString(t, i)
                guard visit((i + 1)..<max(i + 1, end - 1), object) else { return false }
                i = skipSpace(t, end)
                guard i < t.count, t[i] == UInt8(ascii: ":") else { return true }
                i = skipSpace(t, i + 1)
            }
            guard forEachKey(t, &i, depth: depth + 1, visit) else { return false }
        }
    }
}

// MARK: - Keys json-c reads differently

extension RawJSON {
    /// Whether a key anywhere in `text` (valid JSON) holds U+0000: json-c cuts the key there,
    /// other parsers do not, so `{"a":1,"a\u0000":2}` is one member to json-c and two to them.
    /// Nested at most 1024 levels. (The host's scan, `classifyMessage`, refuses such lines itself.)
    public static func hasNULKey(_ text: UnsafeRawBufferPointer) -> Bool {
        var s = Scanner(t: text, maxDepth: 1024)
        _ = s.document()
        return s.nulKey
    }
}

// MARK: - Walking validated JSON text

extension RawJSON {
    /// The members of the object at `span` of validated JSON text `t`, in order: each key's bytes
    /// between its quotes (`keyEscaped` when they hold a backslash escape: the key is then not
    /// its bytes) and its value's span (no surrounding whitespace). Repeated keys are all listed.
    public struct Members: IteratorProtocol, Sequence {
        public struct Member {
            public var key: Range<Int>
            public var keyEscaped: Bool
            public var value: Range<Int>
        }
        var cursor: MemberCursor

        /// An empty sequence when `span` is not an object.
        public init(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) { cursor = MemberCursor(t, span) }

        public mutating func next() -> Member? {
            guard let k = cursor.nextKey() else { return nil }
            return Member(key: k.key, keyEscaped: k.keyEscaped, value: cursor.skipValue())
        }
    }

    /// `Members` for a caller that walks some values itself: after `nextKey`, either `skipValue`
    /// or walk the value and `resume(at:)` its end (a value left alone is skipped).
    public struct MemberCursor {
        let t: UnsafeRawBufferPointer
        var i: Int
        let end: Int
        /// Where the current key's value (or element) starts, until it is skipped or walked.
        var pending: Int?
        /// Past the closing bracket: nothing more to list.
        var done = false

        /// Starts at the object's `{`; no members when `span` is not an object.
        public init(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) {
            let isObject = !span.isEmpty && t[span.lowerBound] == UInt8(ascii: "{")
            self.init(t: t, i: isObject ? span.lowerBound + 1 : span.upperBound, end: span.upperBound)
        }

        init(t: UnsafeRawBufferPointer, i: Int, end: Int) {
            self.t = t
            self.i = i
            self.end = end
        }

        /// After the last member: the index just past the object's `}`.
        public var position: Int { i }

        public mutating func nextKey() -> (key: Range<Int>, keyEscaped: Bool, valueStart: Int)? {
            if pending != nil { _ = skipValue() }
            while !done, i < end {
                i = skipSpace(t, i)
                guard i < end else { return nil }
                let c = t[i]
                if c == UInt8(ascii: "}") { i += 1; done = true; return nil }
                if c == UInt8(ascii: ",") { i += 1; continue }
                guard c == UInt8(ascii: "\"") else { i = end; return nil }
                let keyEnd = skipString(t, i)
                let key = (i + 1)..<(keyEnd - 1)
                i = skipSpace(t, keyEnd)
                guard i < end, t[i] == UInt8(ascii: ":") else { i = end; return nil }
                i = skipSpace(t, i + 1)
                pending = i
                return (key, RawJSON.contains(t, key, UInt8(ascii: "\\")), i)
            }
            return nil
        }

        /// Skips the current value; returns its span (no surrounding whitespace).
        public mutating func skipValue() -> Range<Int> {
            guard let start = pending else { return i..<i }
            pending = nil
            i = RawJSON.skipValue(t, start)
            // skipValue stops before a delimiter; a scalar may carry trailing spaces.
            var e = i
            while e > start, isSpace(t[e - 1]) { e -= 1 }
            return start..<e
        }

        /// The caller walked the current value up to `end`.
        public mutating func resume(at end: Int) {
            pending = nil
            i = end
        }
    }

    /// The element spans of the array at `span` of validated JSON text `t` (empty when `span` is
    /// not an array).
    public struct Elements: IteratorProtocol, Sequence {
        var cursor: ElementCursor

        public init(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) { cursor = ElementCursor(t, span) }

        public mutating func next() -> Range<Int>? {
            guard cursor.nextElement() != nil else { return nil }
            return cursor.skipValue()
        }
    }

    /// `Elements` for a caller that walks some elements itself (see `MemberCursor`).
    public struct ElementCursor {
        var inner: MemberCursor

        /// Starts at the array's `[`; no elements when `span` is not an array.
        public init(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) {
            let isArray = !span.isEmpty && t[span.lowerBound] == UInt8(ascii: "[")
            inner = MemberCursor(t: t, i: isArray ? span.lowerBound + 1 : span.upperBound, end: span.upperBound)
        }

        /// After the last element: the index just past the array's `]`.
        public var position: Int { inner.i }

        /// Where the next element starts.
        public mutating func nextElement() -> Int? {
            if inner.pending != nil { _ = inner.skipValue() }
            let t = inner.t
            while !inner.done, inner.i < inner.end {
                inner.i = skipSpace(t, inner.i)
                guard inner.i < inner.end else { return nil }
                let c = t[inner.i]
                if c == UInt8(ascii: "]") { inner.i += 1; inner.done = true; return nil }
                if c == UInt8(ascii: ",") { inner.i += 1; continue }
                inner.pending = inner.i
                return inner.i
            }
            return nil
        }

        /// Skips the current element; returns its span.
        public mutating func skipValue() -> Range<Int> { inner.skipValue() }
        /// The caller walked the current element up to `end`.
        public mutating func resume(at end: Int) { inner.resume(at: end) }
    }

    /// Whether bytes `r` of `t` hold `byte`.
    @inline(__always) public static func contains(_ t: UnsafeRawBufferPointer, _ r: Range<Int>, _ byte: UInt8) -> Bool {
        guard !r.isEmpty else { return false }
        return memchr(t.baseAddress! + r.lowerBound, Int32(byte), r.count) != nil
    }
}
