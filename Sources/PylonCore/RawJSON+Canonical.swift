#if canImport(Glibc)
import Glibc
#endif

// MARK: - The one reader of message-shaped JSON (docs/PROTOCOL.md "Canonical form")
//
// The payloads of `uploader.enqueue`, `ma.eventRecord` and the backend's ingest batches are read
// from their bytes only: keys and strings decoded here, repeated keys "last wins", and values
// stored in Pylon's canonical form (compact; escapes as the sender wrote them; in each object
// only the last member of a repeated key). json-c reads trees (configuration, manifests, host
// methods, the tag engine) and is the oracle of the property tests, not a second reader.

extension RawJSON {
    /// What `validate` concluded about a text.
    public enum Validation: Equatable, Sendable {
        case valid
        /// Not JSON (RFC 8259, strictly); the scan stopped at byte `at`.
        case invalid(at: Int)
        /// Containers nested deeper than the limit.
        case tooDeep
    }

    /// Validates `text` as one JSON text (any value at the top), strictly (RFC 8259: UTF-8, no
    /// control characters in strings, no leading zeros, nothing but whitespace around it),
    /// nested at most `maxDepth` levels as json-c counts them (every container is a level, and so
    /// is a scalar inside one: `[[0]]` is 3 levels, `[[]]` 2, `0` 1) — deciding every input
    /// itself (keys and `\u` escapes of any kind are grammar; a lone surrogate escape decodes to
    /// U+FFFD). Builds nothing.
    public static func validate(_ text: UnsafeRawBufferPointer, maxDepth: Int) -> Validation {
        var s = Scanner(t: text, maxDepth: maxDepth, decides: true)
        if s.document() { return .valid }
        return s.tooDeep ? .tooDeep : .invalid(at: min(s.i, text.count))
    }

    // MARK: Decoding

    /// Appends the decoded bytes of the string body `r` (the bytes between the quotes, of valid
    /// JSON text) to `out`: every escape of RFC 8259 decoded, a surrogate pair to its scalar, a
    /// lone surrogate to U+FFFD (as json-c does). U+0000 is kept (a key or string holding it is
    /// that longer string; json-c cuts keys there).
    public static func decode(_ t: UnsafeRawBufferPointer, _ r: Range<Int>, into out: inout [UInt8]) {
        var i = r.lowerBound
        let end = r.upperBound
        @inline(__always) func hex4(_ at: Int) -> UInt32? {
            guard at + 4 <= end else { return nil }
            var v: UInt32 = 0
            for j in at..<(at + 4) {
                let c = t[j]
                let d: UInt8
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): d = c - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): d = c - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): d = c - UInt8(ascii: "A") + 10
                default: return nil
                }
                v = v << 4 | UInt32(d)
            }
            return v
        }
        while i < end {
            let c = t[i]
            guard c == UInt8(ascii: "\\"), i + 1 < end else {
                out.append(c)
                i += 1
                continue
            }
            let e = t[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                guard var v = hex4(i) else { return }  // not valid JSON: the rest is not decoded
                i += 4
                if (0xD800..<0xDC00).contains(v), i + 6 <= end, t[i] == UInt8(ascii: "\\"), t[i + 1] == UInt8(ascii: "u"),
                    let lo = hex4(i + 2), (0xDC00..<0xE000).contains(lo)
                {
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00)
                    i += 6
                }
                let u = Unicode.Scalar(v) ?? "\u{FFFD}"
                var utf8 = UTF8.encode(u)!.makeIterator()
                while let b = utf8.next() { out.append(b) }
            default: out.append(e)  // \" \\ \/
            }
        }
    }

    /// The decoded bytes of the string body `r` (see `decode(_:_:into:)`).
    public static func decode(_ t: UnsafeRawBufferPointer, _ r: Range<Int>) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(r.count)
        decode(t, r, into: &out)
        return out
    }

    /// Whether the key (or string body) `r` of `t` decodes to `name`: a byte comparison when it
    /// holds no escape (`escaped` false), else a comparison of its decoded bytes.
    @inline(__always) public static func keyIs(_ t: UnsafeRawBufferPointer, _ r: Range<Int>, escaped: Bool, _ name: StaticString) -> Bool {
        guard escaped else { return equals(t, r.lowerBound, r.upperBound, name) }
        return decode(t, r).elementsEqual(UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
    }

    /// The string value at `span` (a JSON string, quotes included), decoded; nil for any other
    /// value.
    public static func stringValue(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> String? {
        guard span.count >= 2, t[span.lowerBound] == UInt8(ascii: "\""), t[span.upperBound - 1] == UInt8(ascii: "\"") else { return nil }
        let body = (span.lowerBound + 1)..<(span.upperBound - 1)
        guard contains(t, body, UInt8(ascii: "\\")) else {
            return String(decoding: UnsafeRawBufferPointer(rebasing: t[body]), as: UTF8.self)
        }
        return String(decoding: decode(t, body), as: UTF8.self)
    }

    /// The integer at `span` when it is one (digits, optionally negative; no fraction or
    /// exponent), read as json-c reads it: a value beyond Int64 becomes the nearest Int64. nil
    /// for any other value.
    public static func integer(_ t: UnsafeRawBufferPointer, _ span: Range<Int>) -> Int64? {
        if let v = plainInt(t, span) { return v }
        var i = span.lowerBound
        let negative = i < span.upperBound && t[i] == UInt8(ascii: "-")
        if negative { i += 1 }
        guard i < span.upperBound else { return nil }
        for j in i..<span.upperBound where !(t[j] >= UInt8(ascii: "0") && t[j] <= UInt8(ascii: "9")) { return nil }
        return negative ? Int64.min : Int64.max  // digits only, and they did not fit
    }

    // MARK: The canonical form

    /// What `canonical` keeps while it walks: the keys of the objects open around it, each with
    /// where its member starts in the output, and where each open object's keys begin (-1: an
    /// array). One per caller that walks many values, so its storage is allocated once.
    public struct CanonicalScratch {
        var keys: [(key: Range<Int>, escaped: Bool, out: Int)] = []
        var frames: [Int] = []
        public init() {}
    }

    /// Pylon's canonical form of the value starting at `start` of valid JSON text `t`: the
    /// value with the whitespace between tokens removed, every string and number as written
    /// (escapes kept), and in each object only the last member of a key written more than once
    /// (keys compared decoded): what a reader that keeps the last of repeated keys reads, with
    /// nothing another reader could read differently. Reading canonical text again gives the
    /// same bytes.
    ///
    /// Writes it to `out` when given — which needs room for `end - start` bytes (the text walked;
    /// an object's members are removed after they were written) — and returns its length and the
    /// index just past the value. It recurses nowhere; on bytes that are not JSON it stays inside
    /// `t` and within that room, and its output is then meaningless.
    public static func canonical(
        _ t: UnsafeRawBufferPointer, at start: Int, into out: UnsafeMutableRawPointer? = nil, scratch: inout CanonicalScratch
    ) -> (length: Int, end: Int) {
        scratch.keys.removeAll(keepingCapacity: true)
        scratch.frames.removeAll(keepingCapacity: true)
        var n = 0
        var i = start
        /// The next string in an object is a key.
        var expectKey = false
        @inline(__always) func copy(_ r: Range<Int>) {
            if let out, !r.isEmpty { (out + n).copyMemory(from: t.baseAddress! + r.lowerBound, byteCount: r.count) }
            n += r.count
        }
        while true {
            i = skipSpace(t, i)
            guard i < t.count else { break }
            let c = t[i]
            switch c {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                copy(i..<(i + 1))
                i += 1
                scratch.frames.append(c == UInt8(ascii: "{") ? scratch.keys.count : -1)
                expectKey = c == UInt8(ascii: "{")
                continue
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                guard let f = scratch.frames.popLast() else { return (n, i) }  // not JSON: a stray close
                if f >= 0 { scratch.keys.removeLast(scratch.keys.count - f) }
                copy(i..<(i + 1))
                i += 1
                expectKey = false
            case UInt8(ascii: ","):
                guard let f = scratch.frames.last else { return (n, i) }
                copy(i..<(i + 1))
                i += 1
                expectKey = f >= 0
                continue
            case UInt8(ascii: ":"):
                copy(i..<(i + 1))
                i += 1
                continue
            case UInt8(ascii: "\""):
                let e = skipString(t, i)
                if expectKey, let f = scratch.frames.last, f >= 0 {
                    expectKey = false
                    let key = (i + 1)..<max(i + 1, e - 1)
                    let escaped = contains(t, key, UInt8(ascii: "\\"))
                    var memberStart = n
                    if let j = scratch.keys[f...].lastIndex(where: { sameKey(t, $0.key, $0.escaped, key, escaped) }) {
                        // An earlier member of this key: remove it (key to the next member's start).
                        let from = scratch.keys[j].out
                        let to = j + 1 < scratch.keys.count ? scratch.keys[j + 1].out : memberStart
                        let removed = to - from
                        if let out { memmove(out + from, out + to, n - to) }
                        n -= removed
                        memberStart -= removed
                        scratch.keys.remove(at: j)
                        for k in j..<scratch.keys.count { scratch.keys[k].out -= removed }
                    }
                    scratch.keys.append((key, escaped, memberStart))
                    copy(i..<e)
                    i = e
                    continue
                }
                copy(i..<e)
                i = e
            default:
                // A number or a literal: up to the next delimiter.
                let s = i
                while i < t.count, !isSpace(t[i]), !isStructural(t[i]) { i += 1 }
                if i == s { i += 1 }  // not JSON: keep moving
                copy(s..<i)
            }
            if scratch.frames.isEmpty { break }
        }
        return (n, i)
    }

    @inline(__always) static func isStructural(_ c: UInt8) -> Bool {
        c == UInt8(ascii: ",") || c == UInt8(ascii: "}") || c == UInt8(ascii: "]") || c == UInt8(ascii: ":") || c == UInt8(ascii: "{")
            || c == UInt8(ascii: "[") || c == UInt8(ascii: "\"")
    }

    /// Whether two keys of `t` (bytes between their quotes) are the same key once decoded.
    @inline(__always) static func sameKey(_ t: UnsafeRawBufferPointer, _ a: Range<Int>, _ aEscaped: Bool, _ b: Range<Int>, _ bEscaped: Bool)
        -> Bool
    {
        if !aEscaped, !bEscaped {
            return a.count == b.count && equals(t, a.lowerBound, a.upperBound, UnsafeRawBufferPointer(rebasing: t[b]))
        }
        return decode(t, a) == decode(t, b)
    }

    /// `canonical(_:at:into:scratch:)` with a scratch of its own.
    public static func canonical(_ t: UnsafeRawBufferPointer, at start: Int, into out: UnsafeMutableRawPointer? = nil) -> (
        length: Int, end: Int
    ) {
        var scratch = CanonicalScratch()
        return canonical(t, at: start, into: out, scratch: &scratch)
    }

    /// The canonical form of the value at `start` as bytes (tests, cold paths).
    public static func canonicalBytes(_ t: UnsafeRawBufferPointer, at start: Int = 0) -> [UInt8] {
        let (_, end) = canonical(t, at: start)
        let room = max(0, end - start)
        return [UInt8](unsafeUninitializedCapacity: max(1, room)) { buf, count in
            count = room == 0 ? 0 : canonical(t, at: start, into: UnsafeMutableRawPointer(buf.baseAddress!)).length
        }
    }
}

extension JSON {
    /// Whether two values are the same JSON value: objects compared as maps (member order
    /// aside), everything else as `==`. The property tests' and fuzzers' comparison of what
    /// json-c read from a text and from its canonical form.
    public func isSameValue(as other: JSON) -> Bool {
        switch (self, other) {
        case (.array(let a), .array(let b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.isSameValue(as: $1) }
        case (.object(let a), .object(let b)):
            return a.storage.count == b.storage.count
                && a.storage.allSatisfy { k, v in b.storage[k].map { v.isSameValue(as: $0) } ?? false }
        default:
            return self == other
        }
    }
}
