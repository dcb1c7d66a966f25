import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The push plugin's inbox (messages received and not yet acknowledged or discarded) and its
/// dedup keys, in `push.inbox` in the state directory (docs/PUSH.md "On disk"): an `AppendLog`
/// of frames, so a message costs one frame appended (in the write of the MQTT read that brought
/// it) and an acknowledgement one small frame, never a rewrite of database pages.
///
/// Frames (a kind byte, then `FrameWriter` fields):
/// - 1 `seen`: `appId`, a count, the keys (`id:<id>`, `key:<msgKey>`) newly remembered;
/// - 2 `received`: `id`, `appId`, `seq`, `expiresAt`, `cold` (0/1), the payload (the message as
///   delivered);
/// - 3 `removed`: ids that left the inbox (acknowledged, expired, dropped).
///
/// Replay rebuilds the live messages and the newest `maxSeen` keys. The file is compacted (live
/// messages and remembered keys copied, in order, to a new file renamed over it) when it holds
/// more than twice what is live and at least `compactMinBytes`.
final class PushInbox {
    struct Message: Equatable {
        var id: String
        var appId: String
        var seq: Int64
        var payload: String
        var expiresAt: Int64
        var cold: Bool
    }

    static let magic = Array("PYLPUSH1".utf8)
    /// The log is never compacted below this size (compaction rewrites what is live).
    static let defaultCompactMinBytes = 1 << 20

    enum Kind: UInt8 { case seen = 1, received = 2, removed = 3 }

    /// A remembered key: two 64-bit SipHash values of `appId NUL key` under this process's
    /// random seed (in memory only; the log holds the keys). Two keys collide with probability
    /// about n²/2¹²⁹.
    struct SeenHash: Hashable {
        let a: UInt64
        let b: UInt64
        init(_ appId: String, _ key: String) {
            var h1 = Hasher()
            h1.combine(0 as UInt8)
            h1.combine(appId)
            h1.combine(key)
            var h2 = Hasher()
            h2.combine(1 as UInt8)
            h2.combine(appId)
            h2.combine(key)
            a = UInt64(bitPattern: Int64(h1.finalize()))
            b = UInt64(bitPattern: Int64(h2.finalize()))
        }
    }

    let maxSeen: Int
    let compactMinBytes: Int
    let log: AppendLog
    private(set) var messages: [String: Message] = [:]
    private var liveBytes = 0
    private var seen: Set<SeenHash> = []
    /// Remembered keys in the order they were added (a ring: `seenHead` is the oldest).
    private var seenOrder: [SeenHash] = []
    private var seenHead = 0
    /// Keys added over the file's life (numbered in log order); the remembered ones are the last
    /// `seen.count`.
    private var keysAdded = 0
    private var keyBytesAdded = 0
    private var depth = 0
    /// Compactions done by this process (status, tests).
    private(set) var compactions = 0

    /// Opens (creating) the log at `path` and replays it.
    init(path: String, maxSeen: Int, compactMinBytes: Int = PushInbox.defaultCompactMinBytes) throws(IOError) {
        self.maxSeen = maxSeen
        self.compactMinBytes = compactMinBytes
        var frames: [(Kind, [UInt8])] = []
        log = try AppendLog(path: path, magic: Self.magic) { body in
            if let k = body.first.flatMap(Kind.init(rawValue:)) { frames.append((k, Array(body))) }
        }
        for (_, body) in frames { body.withUnsafeBytes { apply($0) } }
    }

    var count: Int { messages.count }
    var maxSeq: Int64 { messages.values.map(\.seq).max() ?? 0 }
    var entries: [Message] { messages.values.sorted { $0.seq < $1.seq } }
    func payload(_ id: String) -> String? { messages[id]?.payload }

    /// Frames appended between `begin` and `commit` are written together (one `write`);
    /// outside, each change is written at once.
    func begin() { depth += 1 }
    func commit() throws(IOError) {
        depth = max(0, depth - 1)
        if depth == 0 { try flush() }
    }

    /// Records `keys` as seen for `appId`; false if any was seen before (the new ones are
    /// recorded either way, as the SQLite table did).
    func markSeen(appId: String, keys: [String]) throws(IOError) -> Bool {
        var fresh: [String] = []
        for k in keys where !seen.contains(SeenHash(appId, k)) && !fresh.contains(k) { fresh.append(k) }
        if !fresh.isEmpty {
            var w = FrameWriter(kind: Kind.seen.rawValue)
            w.string(appId)
            w.varint(UInt64(fresh.count))
            for k in fresh { w.string(k) }
            log.append(w.bytes)
            for k in fresh { remember(appId, k) }
            try changed()
        }
        return fresh.count == keys.count
    }

    func insert(_ m: Message) throws(IOError) {
        guard messages[m.id] == nil else { return }
        log.append(Self.receivedFrame(m))
        messages[m.id] = m
        liveBytes += m.payload.utf8.count + m.id.utf8.count + m.appId.utf8.count + 24
        try changed()
    }

    func remove(_ ids: [String]) throws(IOError) {
        let gone = ids.filter { messages[$0] != nil }
        guard !gone.isEmpty else { return }
        var w = FrameWriter(kind: Kind.removed.rawValue)
        w.varint(UInt64(gone.count))
        for id in gone {
            w.string(id)
            forget(id)
        }
        log.append(w.bytes)
        try changed()
    }

    private func changed() throws(IOError) { if depth == 0 { try flush() } }

    private func flush() throws(IOError) {
        try log.commit()
        if log.bytes >= compactMinBytes, log.bytes > 2 * liveEstimate { try compact() }
    }

    /// What a compacted file would hold, roughly.
    var liveEstimate: Int {
        let keyBytes = keysAdded > 0 ? keyBytesAdded / keysAdded : 0
        return liveBytes + seen.count * (keyBytes + 4)
    }

    // MARK: Replay

    private func apply(_ body: UnsafeRawBufferPointer) {
        var r = FrameReader(body)
        switch r.byte().flatMap(Kind.init(rawValue:)) {
        case .seen?:
            guard let app = r.string(), let n = r.varint(), n <= UInt64(body.count) else { return }
            for _ in 0..<n {
                guard let k = r.string() else { return }
                if !seen.contains(SeenHash(app, k)) { remember(app, k) }
            }
        case .received?:
            guard let m = Self.readReceived(&r), messages[m.id] == nil else { return }
            messages[m.id] = m
            liveBytes += m.payload.utf8.count + m.id.utf8.count + m.appId.utf8.count + 24
        case .removed?:
            guard let n = r.varint(), n <= UInt64(body.count) else { return }
            for _ in 0..<n {
                guard let id = r.string() else { return }
                forget(id)
            }
        case nil: return
        }
    }

    private func remember(_ app: String, _ k: String) {
        let h = SeenHash(app, k)
        seen.insert(h)
        keysAdded += 1
        keyBytesAdded += k.utf8.count
        if seenOrder.count < maxSeen {
            seenOrder.append(h)
        } else {
            // Full: the oldest goes, the new one takes its place in the ring.
            seen.remove(seenOrder[seenHead])
            seenOrder[seenHead] = h
            seenHead = (seenHead + 1) % seenOrder.count
        }
    }

    private func forget(_ id: String) {
        if let m = messages.removeValue(forKey: id) { liveBytes -= m.payload.utf8.count + m.id.utf8.count + m.appId.utf8.count + 24 }
    }

    static func receivedFrame(_ m: Message) -> [UInt8] {
        var w = FrameWriter(kind: Kind.received.rawValue)
        w.string(m.id)
        w.string(m.appId)
        w.int(m.seq)
        w.int(m.expiresAt)
        w.varint(m.cold ? 1 : 0)
        w.string(m.payload)
        return w.bytes
    }

    static func readReceived(_ r: inout FrameReader) -> Message? {
        guard let id = r.string(), let app = r.string(), let seq = r.int(), let exp = r.int(), let cold = r.varint(),
            let payload = r.string()
        else { return nil }
        return Message(id: id, appId: app, seq: seq, payload: payload, expiresAt: exp, cold: cold == 1)
    }

    static func seenFrame(_ app: String, _ keys: [String]) -> [UInt8] {
        var w = FrameWriter(kind: Kind.seen.rawValue)
        w.string(app)
        w.varint(UInt64(keys.count))
        for k in keys { w.string(k) }
        return w.bytes
    }

    // MARK: Compaction

    /// Copies the remembered keys (in the order they were added) and the live messages to a new
    /// file renamed over the log: the file is read once more, frame by frame.
    func compact() throws(IOError) {
        let keepFrom = keysAdded - seen.count
        var n = 0
        var keptBytes = 0
        var out: [[UInt8]] = []
        var copied = Set<String>()
        _ = try AppendLog(path: log.path, magic: Self.magic) { body in
            var r = FrameReader(body)
            switch r.byte().flatMap(Kind.init(rawValue:)) {
            case .seen?:
                guard let app = r.string(), let c = r.varint(), c <= UInt64(body.count) else { return }
                var keep: [String] = []
                for _ in 0..<c {
                    guard let k = r.string() else { return }
                    if n >= keepFrom {
                        keep.append(k)
                        keptBytes += k.utf8.count
                    }
                    n += 1
                }
                if !keep.isEmpty { out.append(Self.seenFrame(app, keep)) }
            case .received?:
                guard let m = Self.readReceived(&r), messages[m.id] == m, copied.insert(m.id).inserted else { return }
                out.append(Array(body))
            default: return
            }
        }
        try log.rewrite(out)
        keysAdded = seen.count
        keyBytesAdded = keptBytes
        compactions += 1
    }
}

// MARK: Migration

extension PushInbox {
    /// From the SQLite tables `inbox` and `seen` of `push.db` (releases before the log): when
    /// either has rows, the newest `maxSeen` keys and every message are written to a new log
    /// (renamed over `path`), then the rows are deleted. A crash in between migrates again at
    /// the next start (the log is rebuilt from the rows; nothing was appended to it meanwhile).
    static func migrate(from store: PushStore, to path: String, maxSeen: Int) throws(IOError) {
        let db = store.db
        let n = { (t: String) in (try? db.query("SELECT count(*) FROM \(t)"))?.first?.first?.int ?? 0 }
        guard n("inbox") + n("seen") > 0 else { return }
        var out: [[UInt8]] = []
        let keys =
            (try? db.query("SELECT app_id, key FROM seen ORDER BY n DESC LIMIT ?", [.int(Int64(maxSeen))])) ?? []
        var run: (String, [String])?
        for r in keys.reversed() {
            guard let app = r[0].text, let k = r[1].text else { continue }
            if run?.0 == app {
                run!.1.append(k)
            } else {
                if let (a, ks) = run { out.append(seenFrame(a, ks)) }
                run = (app, [k])
            }
        }
        if let (a, ks) = run { out.append(seenFrame(a, ks)) }
        let rows = (try? db.query("SELECT id, app_id, seq, payload, expires_at, cold FROM inbox ORDER BY seq")) ?? []
        for r in rows {
            guard let id = r[0].text, let app = r[1].text, let seq = r[2].int, let p = r[3].text, let exp = r[4].int else { continue }
            out.append(receivedFrame(Message(id: id, appId: app, seq: seq, payload: p, expiresAt: exp, cold: r[5].int == 1)))
        }
        var file = magic
        for b in out { AppendLog.frame(b, into: &file) }
        try System.writeFileAtomically(atPath: path, contents: file)
        do throws(SQLiteError) { try db.exec("BEGIN; DELETE FROM inbox; DELETE FROM seen; COMMIT;") } catch {
            throw IOError(errnoCode: EIO, reason: "push.db: cannot clear the migrated inbox (\(error.description))")
        }
    }
}
