// MARK: - Member spans of a line the host has already validated

extension RawJSON {
    /// The spans of the top-level JSON-RPC members of `text`, a line the host has validated
    /// strictly before writing it (RFC 8259, UTF-8, depth: `classifyMessage` or the strict
    /// json-c tokener) — found without validating it again. This is the plugin kit's reader: a
    /// plugin's bus channel is a descriptor only `pylond` writes to, and every line on it is
    /// either a client's or plugin's line that passed the host's strict check (relayed with its
    /// `id` spliced and `_pylon` added) or one the host wrote itself with `Envelope`. Checking
    /// it a second time cost 9–12% of a busy plugin's CPU.
    ///
    /// On such a line the spans are exactly those of `classifyMessage`'s `.message` (the last
    /// duplicate wins; no surrounding whitespace; a top-level key written with escapes is
    /// decoded to be named, as there). It returns nil — json-c then decides — for anything that
    /// is not shaped like an object of `"key": value` members.
    ///
    /// On any other bytes it may return spans of garbage, but it reads only inside `text`, never
    /// traps, and every span it returns lies inside `text` and is non-empty: what a corrupted
    /// line can do is give a handler wrong text, not break the process. It recurses nowhere, so
    /// depth does not matter either (the host's `limits.maxDepth` may exceed the kit's own).
    public static func hostMessageSpans(_ text: UnsafeRawBufferPointer) -> MessageSpans? {
        let t = text
        let n = t.count
        var spans = MessageSpans()
        var i = skipSpace(t, 0)
        guard i < n, t[i] == UInt8(ascii: "{") else { return nil }
        i = skipSpace(t, i + 1)
        if i < n, t[i] == UInt8(ascii: "}") { return skipSpace(t, i + 1) == n ? spans : nil }
        while true {
            guard i < n, t[i] == UInt8(ascii: "\"") else { return nil }
            let keyStart = i + 1
            i = skipString(t, i)  // just past the closing quote, or n when there is none
            guard i > keyStart, i <= n, t[i - 1] == UInt8(ascii: "\"") else { return nil }
            let keyEnd = i - 1
            let escaped = contains(t, keyStart..<keyEnd, UInt8(ascii: "\\"))
            i = skipSpace(t, i)
            guard i < n, t[i] == UInt8(ascii: ":") else { return nil }
            i = skipSpace(t, i + 1)
            guard i < n, startsValue(t[i]) else { return nil }
            let valueStart = i
            i = skipValue(t, i)
            var e = min(i, n)
            while e > valueStart, isSpace(t[e - 1]) { e -= 1 }
            guard e > valueStart else { return nil }
            let span = valueStart..<e
            if escaped {
                spans.assign(t, escapedKey: keyStart..<keyEnd, span)
            } else {
                spans.assign(t, key: keyStart, keyEnd, span)
            }
            i = skipSpace(t, i)
            guard i < n else { return nil }
            if t[i] == UInt8(ascii: ",") {
                i = skipSpace(t, i + 1)
                continue
            }
            guard t[i] == UInt8(ascii: "}") else { return nil }
            return skipSpace(t, i + 1) == n ? spans : nil
        }
    }

    /// Whether `c` can begin a JSON value.
    @inline(__always) private static func startsValue(_ c: UInt8) -> Bool {
        switch c {
        case UInt8(ascii: "\""), UInt8(ascii: "{"), UInt8(ascii: "["), UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"),
            UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default: return false
        }
    }
}
