import PylonCore

/// A stored record's text, `{"id":<string>,"ts":<digits>,"data":<json>}`, read back.
enum RecordText {
    /// The id as written (a JSON string literal, quotes included); nil when `t` is not a record's
    /// text (a damaged or zeroed one).
    static func escapedID(_ t: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        let p = Chunk.idPrefix
        guard t.count > p.count + 2, t.starts(with: p), t[p.count] == UInt8(ascii: "\""), t[t.count - 1] == UInt8(ascii: "}") else {
            return nil
        }
        var j = p.count + 1
        while j < t.count, t[j] != UInt8(ascii: "\"") { j += t[j] == UInt8(ascii: "\\") ? 2 : 1 }
        guard j < t.count else { return nil }
        return UnsafeRawBufferPointer(rebasing: t[p.count...j])
    }

    /// The id, ts and data of a record's text.
    static func parts(_ t: UnsafeRawBufferPointer) -> (escapedID: UnsafeRawBufferPointer, ts: Int64, data: UnsafeRawBufferPointer)? {
        guard let id = escapedID(t) else { return nil }
        var j = (id.baseAddress! - t.baseAddress!) + id.count + #","ts":"#.utf8.count
        var negative = false
        if j < t.count, t[j] == UInt8(ascii: "-") {
            negative = true
            j += 1
        }
        var v: Int64 = 0
        while j < t.count, t[j] >= 0x30, t[j] <= 0x39 {
            v = v &* 10 &+ Int64(t[j] - 0x30)
            j += 1
        }
        j += #","data":"#.utf8.count
        guard j < t.count else { return nil }
        return (id, negative ? -v : v, UnsafeRawBufferPointer(rebasing: t[j..<(t.count - 1)]))
    }
}
