import PylonCore
import PylonStore

/// The data-layer values persisted through `gtm.lifetime`, each under its owner, in
/// `<stateDir>/gtm.lifetime` (docs/GTM.md "On disk"): an `AppendLog`, so a push carrying
/// `gtm.lifetime` costs one frame appended (one `write`), never a rewrite of database pages.
///
/// Frames (a kind byte, then `FrameWriter` fields):
/// - 1 `set`: owner key, `expiresAt` (ms), a count, then (key, value as JSON text) pairs;
/// - 2 `removed`: owner key, a count, the keys (dropped past `maxEntries`, the soonest-expiring
///   first).
///
/// Replay keeps each (owner, key)'s last value; expired ones are skipped. The file is compacted
/// (the live values copied to a new file renamed over it) when it holds more than twice what is
/// live and at least `compactMinBytes`, and at open when anything expired.
final class LifetimeLog {
    struct Value: Equatable {
        var text: String
        var expiresAtMs: Int64
        /// Order of the write that set it (replay order; restored values follow it).
        var order: Int
    }

    static let magic = Array("PYLGTML1".utf8)
    static let defaultCompactMinBytes = 256 << 10

    enum Kind: UInt8 { case set = 1, removed = 2 }

    let log: AppendLog
    let compactMinBytes: Int
    private(set) var values: [String: [String: Value]] = [:]
    private var order = 0
    private var liveBytes = 0
    private(set) var compactions = 0

    /// Opens (creating) the log at `path`, replays it and drops what expired by `nowMs`.
    init(path: String, nowMs: Int64, compactMinBytes: Int = LifetimeLog.defaultCompactMinBytes) throws(IOError) {
        self.compactMinBytes = compactMinBytes
        var frames: [[UInt8]] = []
        log = try AppendLog(path: path, magic: Self.magic) { frames.append(Array($0)) }
        for f in frames { f.withUnsafeBytes { apply($0) } }
        var expired = false
        for (o, kv) in values {
            for (k, v) in kv where v.expiresAtMs <= nowMs {
                values[o]![k] = nil
                liveBytes -= Self.cost(k, v)
                expired = true
            }
            if values[o]!.isEmpty { values[o] = nil }
        }
        if expired || log.truncatedBytes > 0 { try compact() }
    }

    /// Every live value in write order: (owner key, key, value text).
    var all: [(String, String, String)] {
        values.flatMap { o, kv in kv.map { (o, $0.key, $0.value) } }.sorted { $0.2.order < $1.2.order }.map { ($0.0, $0.1, $0.2.text) }
    }

    /// Persists `owner`'s entries (one frame, one `write`); past `maxEntries` for that owner its
    /// soonest-expiring go first (another owner's values are never touched).
    func persist(_ owner: String, _ entries: [(String, String)], expiresAtMs: Int64, maxEntries: Int) throws(IOError) {
        guard !entries.isEmpty else { return }
        var w = FrameWriter(kind: Kind.set.rawValue)
        w.string(owner)
        w.int(expiresAtMs)
        w.varint(UInt64(entries.count))
        for (k, v) in entries {
            w.string(k)
            w.string(v)
        }
        log.append(w.bytes)
        set(owner, entries, expiresAtMs)
        if let kv = values[owner], kv.count > maxEntries {
            let drop = kv.sorted { ($0.value.expiresAtMs, $0.value.order) < ($1.value.expiresAtMs, $1.value.order) }
                .prefix(kv.count - maxEntries).map(\.key)
            var r = FrameWriter(kind: Kind.removed.rawValue)
            r.string(owner)
            r.varint(UInt64(drop.count))
            for k in drop { r.string(k) }
            log.append(r.bytes)
            remove(owner, drop)
        }
        try log.commit()
        if log.bytes >= compactMinBytes, log.bytes > 2 * liveBytes { try compact() }
    }

    private func set(_ owner: String, _ entries: [(String, String)], _ exp: Int64) {
        for (k, v) in entries {
            order += 1
            if let old = values[owner]?[k] { liveBytes -= Self.cost(k, old) }
            let nv = Value(text: v, expiresAtMs: exp, order: order)
            values[owner, default: [:]][k] = nv
            liveBytes += Self.cost(k, nv)
        }
    }

    private func remove(_ owner: String, _ keys: [String]) {
        for k in keys {
            if let old = values[owner]?.removeValue(forKey: k) { liveBytes -= Self.cost(k, old) }
        }
        if values[owner]?.isEmpty == true { values[owner] = nil }
    }

    static func cost(_ k: String, _ v: Value) -> Int { k.utf8.count + v.text.utf8.count + 24 }

    private func apply(_ body: UnsafeRawBufferPointer) {
        var r = FrameReader(body)
        switch r.byte().flatMap(Kind.init(rawValue:)) {
        case .set?:
            guard let o = r.string(), let exp = r.int(), let n = r.varint(), n <= UInt64(body.count) else { return }
            var entries: [(String, String)] = []
            for _ in 0..<n {
                guard let k = r.string(), let v = r.string() else { return }
                entries.append((k, v))
            }
            set(o, entries, exp)
        case .removed?:
            guard let o = r.string(), let n = r.varint(), n <= UInt64(body.count) else { return }
            var keys: [String] = []
            for _ in 0..<n {
                guard let k = r.string() else { return }
                keys.append(k)
            }
            remove(o, keys)
        case nil: return
        }
    }

    /// Rewrites the file with the live values, one frame per value in write order.
    func compact() throws(IOError) {
        let sorted = values.flatMap { o, kv in kv.map { (o, $0.key, $0.value) } }.sorted { $0.2.order < $1.2.order }
        try log.rewrite(sorted.map { Self.setFrame($0.0, $0.1, $0.2) })
        compactions += 1
    }

    static func setFrame(_ owner: String, _ k: String, _ v: Value) -> [UInt8] {
        var w = FrameWriter(kind: Kind.set.rawValue)
        w.string(owner)
        w.int(v.expiresAtMs)
        w.varint(1)
        w.string(k)
        w.string(v.text)
        return w.bytes
    }
}
