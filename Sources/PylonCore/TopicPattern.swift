#if canImport(Glibc)
import Glibc
#endif

/// A topic pattern for `bus.subscribe`: literal text with `*` matching any run of bytes
/// (`push.*`, `*.changed`, `*`), compared as UTF-8 bytes.
///
/// Matching is linear in the topic: the literal pieces between stars are found leftmost first
/// (which is exact for `*`-only patterns) by Knuth-Morris-Pratt. The earlier search by `Character`
/// positions was quadratic: a 20,000-byte pattern against a 40,000-byte topic held the host's
/// loop for 34 s. The host also bounds topics and patterns (`InboundEnvelope.isValidMethodName`).
public struct TopicPattern: Hashable, Sendable, CustomStringConvertible {
    public let text: String
    private let parts: [[UInt8]]
    /// Per part, the KMP failure table (for each prefix length, the longest proper border).
    private let borders: [[Int]]

    public init(_ text: String) {
        self.text = text
        parts = text.utf8.split(separator: UInt8(ascii: "*"), omittingEmptySubsequences: false).map(Array.init)
        borders = parts.map { p in
            var b = [Int](repeating: 0, count: p.count + 1)
            var k = 0
            if p.count > 1 {
                for i in 1..<p.count {
                    while k > 0 && p[i] != p[k] { k = b[k] }
                    if p[i] == p[k] { k += 1 }
                    b[i + 1] = k
                }
            }
            return b
        }
    }
    public var description: String { text }

    public static func == (a: TopicPattern, b: TopicPattern) -> Bool { a.text == b.text }
    public func hash(into h: inout Hasher) { h.combine(text) }

    public func matches(_ topic: String) -> Bool {
        var topic = topic
        return topic.withUTF8 { matches(bytes: UnsafeRawBufferPointer($0)) }
    }

    /// `matches` for a topic's UTF-8 bytes.
    public func matches(bytes t: UnsafeRawBufferPointer) -> Bool {
        @inline(__always) func equal(_ at: Int, _ piece: [UInt8]) -> Bool {
            piece.isEmpty || piece.withUnsafeBytes { memcmp(t.baseAddress! + at, $0.baseAddress!, piece.count) == 0 }
        }
        let first = parts[0]
        if parts.count == 1 { return t.count == first.count && equal(0, first) }
        let last = parts[parts.count - 1]
        guard t.count >= first.count + last.count, equal(0, first) else { return false }
        var at = first.count
        let end = t.count - last.count
        for j in 1..<(parts.count - 1) where !parts[j].isEmpty {
            guard let past = find(j, in: t, from: at, to: end) else { return false }
            at = past
        }
        return equal(end, last)
    }

    /// The index just past the leftmost occurrence of part `j` in `t[from..<to]`, or nil (KMP:
    /// each byte of the topic is looked at a bounded number of times).
    private func find(_ j: Int, in t: UnsafeRawBufferPointer, from: Int, to: Int) -> Int? {
        let p = parts[j]
        let b = borders[j]
        var k = 0
        var i = from
        while i < to {
            while k > 0 && t[i] != p[k] { k = b[k] }
            if t[i] == p[k] { k += 1 }
            i += 1
            if k == p.count { return i }
        }
        return nil
    }
}

extension String {
    /// The first occurrence of `needle`, or nil (no Foundation in the daemon).
    package func range(of needle: String) -> Range<String.Index>? {
        self[...].range(of: needle[...])
    }
}

extension Substring {
    /// The first occurrence of `needle`, or nil.
    package func range(of needle: Substring) -> Range<Substring.Index>? {
        guard !needle.isEmpty, count >= needle.count else { return nil }
        var i = startIndex
        while i < endIndex {
            if self[i...].hasPrefix(needle) { return i..<index(i, offsetBy: needle.count) }
            i = index(after: i)
        }
        return nil
    }
}
