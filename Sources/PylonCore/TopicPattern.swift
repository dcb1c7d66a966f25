/// A topic pattern for `bus.subscribe`: literal text with `*` matching any run of characters
/// (`push.*`, `*.changed`, `*`).
public struct TopicPattern: Hashable, Sendable, CustomStringConvertible {
    public let text: String
    private let parts: [Substring]

    public init(_ text: String) {
        self.text = text
        parts = text.split(separator: "*", omittingEmptySubsequences: false)
    }
    public var description: String { text }

    public func matches(_ topic: String) -> Bool {
        if parts.count == 1 { return topic == text }
        var rest = topic[...]
        guard rest.hasPrefix(parts[0]) else { return false }
        rest = rest.dropFirst(parts[0].count)
        let last = parts[parts.count - 1]
        for mid in parts[1..<(parts.count - 1)] where !mid.isEmpty {
            guard let r = rest.range(of: mid) else { return false }
            rest = rest[r.upperBound...]
        }
        return rest.count >= last.count && rest.hasSuffix(last)
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
