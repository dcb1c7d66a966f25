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

    @inline(__always) static func skipSpace(_ t: UnsafeRawBufferPointer, _ i: Int) -> Int {
        var i = i
        while i < t.count, isSpace(t[i]) { i += 1 }
        return i
    }

    /// `i` at an opening quote; returns the index after the closing quote.
    static func skipString(_ t: UnsafeRawBufferPointer, _ i: Int) -> Int {
        var i = i + 1
        while i < t.count {
            let c = t[i]
            if c == UInt8(ascii: "\\") { i += 2; continue }
            if c == UInt8(ascii: "\"") { return i + 1 }
            i += 1
        }
        return t.count
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

    @inline(__always) static func equals(_ t: UnsafeRawBufferPointer, _ s: Int, _ e: Int, _ key: StaticString) -> Bool {
        guard e - s == key.utf8CodeUnitCount else { return false }
        let k = key.utf8Start
        for j in 0..<(e - s) where t[s + j] != k[j] { return false }
        return true
    }
}
