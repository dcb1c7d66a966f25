/// The ids of a stream's records delivered lately, at most `DeliveredIds.window` (the oldest
/// leaves first): an enqueue of one of them is a duplicate, as one still queued is. So a client
/// that retries an enqueue whose answer it lost (its own timeout, a pending `-32008`) stores
/// nothing twice even when the first copy went out meanwhile (docs/UPLOADER.md, the id rule).
/// Kept in memory: a restart of the uploader forgets it (the reference backend still keeps one
/// record per stream and id).
struct DeliveredIds {
    /// Delivered ids remembered per stream (about 48 bytes each).
    static let window = 1_024

    private var keys: Set<RecordKey> = []
    private var ring: [RecordKey] = []
    private var head = 0

    func contains(_ key: RecordKey) -> Bool { keys.contains(key) }

    mutating func add(_ added: [RecordKey]) {
        for k in added where keys.insert(k).inserted {
            if ring.count < Self.window {
                ring.append(k)
                continue
            }
            keys.remove(ring[head])
            ring[head] = k
            head = (head + 1) % ring.count
        }
    }
}
