import PylonCore

/// The data layer: a persistent map that pushes deep-merge into.
///
/// - Dotted top-level keys of a push expand (`"a.b": 1` → `{a: {b: 1}}`); reads follow dotted
///   paths through maps.
/// - Maps merge recursively; lists merge index by index (the target grows); `null` overwrites;
///   scalars overwrite; a type mismatch replaces.
public struct DataLayer: Sendable, Equatable {
    public private(set) var root: JSONObject

    public init(_ root: JSONObject = [:]) { self.root = root }

    /// The most dot-separated parts a pushed key expands into (`a.b.c` has 3); a key with more
    /// is kept as written, not expanded. Each part is a level of nesting, which the host's
    /// `maxDepth` does not see in a key: 100,000 parts crashed the plugin in the recursive merge.
    public static let maxKeyParts = 32

    /// The value at dotted `path`, or nil (a missing key, or a non-map on the way).
    public func get(_ path: String) -> JSON? {
        if let direct = root[path] { return direct }
        var cur: JSON = .object(root)
        for part in path.split(separator: ".", omittingEmptySubsequences: false) {
            guard case .object(let o) = cur, let next = o[String(part)] else { return nil }
            cur = next
        }
        return cur
    }

    /// Merges a pushed map (its dotted keys expanded first).
    public mutating func push(_ update: JSONObject) {
        let expanded = DataLayer.expand(update)
        for (k, v) in expanded { root[k] = DataLayer.merge(root[k], v) }
    }

    /// `{"a.b": 1}` → `{"a": {"b": 1}}` (top-level keys only, as the SDK did).
    public static func expand(_ o: JSONObject) -> JSONObject {
        var out = JSONObject()
        for (k, v) in o {
            let parts = k.split(separator: ".", maxSplits: maxKeyParts, omittingEmptySubsequences: false).map(String.init)
            guard parts.count > 1, parts.count <= maxKeyParts, !parts.contains(where: \.isEmpty) else {
                out[k] = merge(out[k], v)
                continue
            }
            var value = v
            for p in parts.dropFirst().reversed() { value = .object([p: value]) }
            out[parts[0]] = merge(out[parts[0]], value)
        }
        return out
    }

    /// Merges `source` into `target`.
    public static func merge(_ target: JSON?, _ source: JSON) -> JSON {
        switch (target, source) {
        case (.object(var t)?, .object(let s)):
            for (k, v) in s { t[k] = merge(t[k], v) }
            return .object(t)
        case (.array(var t)?, .array(let s)):
            for (i, v) in s.enumerated() {
                if i < t.count { t[i] = merge(t[i], v) } else { t.append(merge(nil, v)) }
            }
            return .array(t)
        default:
            return source
        }
    }

    /// The map flattened to dotted key → leaf value pairs (how `gtm.lifetime` values are stored).
    public static func flatten(_ o: JSONObject, prefix: String = "") -> [(String, JSON)] {
        var out: [(String, JSON)] = []
        for (k, v) in o {
            let key = prefix.isEmpty ? k : prefix + "." + k
            if case .object(let inner) = v, !inner.isEmpty {
                out += flatten(inner, prefix: key)
            } else {
                out.append((key, v))
            }
        }
        return out
    }

    /// `gtm.lifetime`: `(\d+)\s*([smhd]?)`, no unit = milliseconds. Nil when absent, not
    /// positive or malformed (the values are then not persisted).
    public static func lifetimeMs(_ v: JSON?) -> Int64? {
        let text: String
        switch v {
        case .string(let s)?: text = s.trimmingWhitespace
        case .int(let i)?: text = String(i)
        default: return nil
        }
        var digits = Substring(text).prefix { $0.isASCII && $0.isNumber }
        guard !digits.isEmpty, digits.count <= 15, let n = Int64(digits) else { return nil }
        var rest = text.dropFirst(digits.count)
        while rest.first == " " || rest.first == "\t" { rest = rest.dropFirst() }
        digits = ""
        let mult: Int64
        switch rest {
        case "": mult = 1
        case "s": mult = 1000
        case "m": mult = 60_000
        case "h": mult = 3_600_000
        case "d": mult = 86_400_000
        default: return nil
        }
        guard n > 0 else { return nil }
        let (r, o) = n.multipliedReportingOverflow(by: mult)
        return o ? nil : r
    }
}

/// Pushes are handled in order; a push made while one is being handled (by a tag) queues
/// behind it. More queued than `limit` means a push loop: the queue is cleared and the caller
/// reports an error.
public struct PushQueue<Item: Sendable>: Sendable {
    public static var defaultLimit: Int { 500 }
    public let limit: Int
    public private(set) var items: [Item] = []
    public private(set) var busy = false

    public init(limit: Int = 500) { self.limit = limit }

    public enum Enqueue: Equatable, Sendable { case accepted, loopDetected }

    public mutating func enqueue(_ m: Item) -> Enqueue {
        if items.count >= limit {
            items.removeAll()
            return .loopDetected
        }
        items.append(m)
        return .accepted
    }

    /// The next push to handle, marking the queue busy; nil (and idle) when empty.
    public mutating func next() -> Item? {
        guard !items.isEmpty else {
            busy = false
            return nil
        }
        busy = true
        return items.removeFirst()
    }
}
