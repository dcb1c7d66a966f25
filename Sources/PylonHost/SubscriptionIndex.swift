import PylonCore

/// Topic patterns → subscribers, so that a publication finds its subscribers without visiting
/// every connected peer: a pattern without `*` is one dictionary lookup by topic; patterns with
/// `*` are matched once each (however many peers share one), not once per peer.
///
/// A value type with no I/O: `Bus` keeps one, fed by `bus.subscribe`/`bus.unsubscribe`, a plugin's
/// handshake (its manifest's `subscribes`) and a peer's close; `publish` asks `subscribers(of:)`.
/// Unit-tested in SubscriptionIndexTests.
struct SubscriptionIndex<ID: Hashable> {
    /// Patterns without a wildcard, by their text (the topic they match).
    private var exact: [String: Set<ID>] = [:]
    /// Patterns with at least one `*`.
    private var wildcard: [TopicPattern: Set<ID>] = [:]

    var isEmpty: Bool { exact.isEmpty && wildcard.isEmpty }
    /// Distinct patterns held (exact and wildcard).
    var patternCount: Int { exact.count + wildcard.count }

    static func isWildcard(_ p: TopicPattern) -> Bool { p.text.utf8.contains(UInt8(ascii: "*")) }

    mutating func add(_ pattern: TopicPattern, _ id: ID) {
        if Self.isWildcard(pattern) {
            wildcard[pattern, default: []].insert(id)
        } else {
            exact[pattern.text, default: []].insert(id)
        }
    }

    mutating func remove(_ pattern: TopicPattern, _ id: ID) {
        if Self.isWildcard(pattern) {
            guard var ids = wildcard[pattern] else { return }
            ids.remove(id)
            wildcard[pattern] = ids.isEmpty ? nil : ids
        } else {
            guard var ids = exact[pattern.text] else { return }
            ids.remove(id)
            exact[pattern.text] = ids.isEmpty ? nil : ids
        }
    }

    /// Removes `id` from each of `patterns` (the ones it was added under).
    mutating func remove(_ id: ID, from patterns: some Sequence<TopicPattern>) {
        for p in patterns { remove(p, id) }
    }

    /// Every subscriber with a pattern matching `topic`, each once.
    func subscribers(of topic: String) -> Set<ID> {
        var out = exact[topic] ?? []
        for (pattern, ids) in wildcard where pattern.matches(topic) { out.formUnion(ids) }
        return out
    }

    /// Whether `id` holds a pattern matching `topic`.
    func isSubscribed(_ id: ID, to topic: String) -> Bool {
        if exact[topic]?.contains(id) == true { return true }
        return wildcard.contains { $0.value.contains(id) && $0.key.matches(topic) }
    }
}
