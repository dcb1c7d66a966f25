import PylonCore
import PylonStore

/// One record of an enqueue, pointing into the request's text (`EnqueueParams`; valid while the
/// request's `Call` is alive): the hot path copies each byte once, into its chunk.
struct PendingRecord {
    var id: UnsafePointer<CChar>
    var idLength: Int32
    var ts: Int64
    var body: UnsafePointer<CChar>
    var bodyLength: Int32
}

/// A queue operation the segment log could not do.
struct QueueError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// The uploader's durable queue, format 4 (docs/UPLOADER.md "On disk"): an append-only log.
///
/// Records are appended to segment files (`SegmentLog`) in the upload body's form, one records
/// frame per stream and switch per group commit; the batch ledger is frames of the same log,
/// one per batch and event (a cut, made final, delivered or purged, dissolved). A group commit
/// is one write (and one fdatasync with `"fsync": "full"`) carrying its records and the
/// delivered batches' `done` frame. What is queued is held in memory as a `QueueIndex`, rebuilt
/// by replaying the segments at open; this class is the I/O shell around it: it writes the
/// frames, reads texts back, and does what the index decides (the reclaim of segments,
/// `Store+Reclaim.swift`).
///
/// The SQLite database beside it (`uploader.db`) keeps what is written once per stream or per
/// refused batch: stream owners, saved settings and dead letters (`Store+Owners.swift`,
/// `Store+DeadLetters.swift`).
final class UploaderStore {
    typealias Rec = QueueIndex.Rec
    typealias Context = QueueIndex.Context
    typealias Placed = QueueIndex.Placed
    typealias StreamSummary = QueueIndex.StreamSummary

    let db: Database
    let log: SegmentLog
    let fsyncEveryCommit: Bool
    /// How new records frames are written: packed (`deflate`) or as they are sent (`none`).
    let compression: QueueCompression
    /// The queue in memory.
    var index = QueueIndex()

    /// The on-disk format this code writes (`PRAGMA user_version` of the database); 3 and below
    /// kept the records in the database and are migrated at open (`Store+Migration.swift`).
    static let format: Int64 = 4
    /// A segment is closed past this many bytes (`segmentBytes(maxDiskBytes:)`).
    static let defaultSegmentBytes = 4 << 20
    static let minSegmentBytes = 64 << 10

    /// The segment size for a disk cap: at most an eighth of it, so the bytes of delivered
    /// records waiting in segments stay small beside the cap.
    static func segmentBytes(maxDiskBytes: Int) -> Int { min(defaultSegmentBytes, max(minSegmentBytes, maxDiskBytes / 8)) }
    /// The oldest segment, closed and still holding live records, is copied forward and removed
    /// once its live records take less than 1/`compactLiveFraction` of it.
    static let compactLiveFraction = 4
    /// A lane's deflate context (docs/UPLOADER.md "On disk") ends once it has taken this many
    /// bytes of uncompressed text, so reading one record never inflates more than this (and one
    /// chunk).
    static let packContextBytes = 64 << 10
    /// At most this many lanes keep a deflate stream open (`LaneDeflate.memoryBytes` each): a frame
    /// of another lane takes the stream of the one written least recently, whose context ends
    /// (its next frame starts a new one). Bounds the memory whatever the number of streams.
    static let maxOpenPacks = 16

    /// A lane's running deflate context in the active segment: its stream, where it started,
    /// the next frame's `seq`, and the uncompressed text it has taken.
    struct Pack {
        var stream: Deflater
        var start: Int
        var seq: UInt64
        var bytes: Int
        /// When it was last written to (`packClock`): the least recent gives its stream up.
        var used: UInt64 = 0
    }

    struct LaneKey: Hashable {
        var stream: String
        var consent: String
    }

    /// Lanes declared in the active segment.
    private var lanes: [LaneKey: UInt64] = [:]
    private var lanesOf: UInt32 = 0
    /// The deflate contexts open in the active segment, per lane (freed when it closes).
    var packs: [UInt64: Pack] = [:]
    private var packClock: UInt64 = 0
    /// Lanes with a deflate stream open (tests).
    var openPacks: Int { packs.count }
    /// Where the last read of a context stopped: its inflate stream after the last frame read,
    /// that frame's end, its lane and the next `seq`. Batches are read in queue order, so the
    /// next read of the same context usually goes on from there instead of from its first frame.
    /// Dropped when a frame is rewritten or a segment removed (`Store+Batches.swift`).
    var readCursor: (c: Context, next: Int, lane: UInt64, seq: UInt64, inflater: Inflater)?
    /// How much of a segment `zeroContext` reads at a time (tests: less).
    var zeroReadWindow = 256 << 10
    /// Delivered batches whose `done` frame waits for the next group commit (`deleteDelivered`).
    var deliveredQueue: [String] = []

    /// Records dropped at open because their frame was damaged (logged by the caller).
    private(set) var damagedRecords = 0
    /// Bytes cut off torn tails at open (logged by the caller).
    private(set) var truncatedBytes = 0

    /// Opens (creating or migrating) the queue of database `path`: its segments are in
    /// `<path minus .db>.queue/`.
    init(
        path: String, fsyncEveryCommit: Bool, segmentBytes: Int = UploaderStore.defaultSegmentBytes,
        compression: QueueCompression = .deflate
    ) throws {
        self.fsyncEveryCommit = fsyncEveryCommit
        self.compression = compression
        db = try Database(path: path)
        try db.exec("PRAGMA journal_mode=WAL")
        try db.exec("PRAGMA synchronous=\(fsyncEveryCommit ? "FULL" : "NORMAL")")
        // The ledger's rows may name personal data (dead letters): freed pages are zeroed.
        try db.exec("PRAGMA secure_delete=ON")
        let version = try db.query("PRAGMA user_version").first?[0].int ?? 0
        try db.exec(
            """
            CREATE TABLE IF NOT EXISTS dead_letters(
              seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
              body TEXT NOT NULL, batch TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL,
              at_ms INTEGER NOT NULL, ts INTEGER);
            -- endpoint: no longer written or read; kept so existing queues open unchanged.
            CREATE TABLE IF NOT EXISTS stream_settings(
              stream TEXT PRIMARY KEY, max_count INTEGER, interval_ms INTEGER, endpoint TEXT);
            -- Who first wrote each stream ("uid:N" or "plugin:NAME").
            CREATE TABLE IF NOT EXISTS stream_owners(
              stream TEXT PRIMARY KEY, owner TEXT NOT NULL, created_ms INTEGER NOT NULL);
            """)
        let dir = UploaderStore.queueDirectory(path)
        try UploaderStore.migrateToSegments(db: db, version: version, dir: dir, segmentBytes: segmentBytes)
        log = try SegmentLog(dir: dir, maxSegmentBytes: segmentBytes, fsyncEveryAppend: fsyncEveryCommit)
        try addDeadLetterTS()
        try replay()
        try db.exec("PRAGMA user_version=\(UploaderStore.format)")
        // A batch set aside whose `done` frame a crash lost: its dead letters are in the database.
        for (_, b) in index.batches where try db.query("SELECT 1 FROM dead_letters WHERE batch=? LIMIT 1", [.text(b.key)]).first != nil {
            try deleteBatch(b.key, zero: true)
        }
    }

    /// `uploader.db` → `uploader.queue`.
    static func queueDirectory(_ dbPath: String) -> String {
        (dbPath.hasSuffix(".db") ? String(dbPath.dropLast(3)) : dbPath) + ".queue"
    }

    func close() {
        log.close()
        db.close()
    }

    // MARK: Replay

    /// Reads every segment into the index (`QueueIndex.Replay`). A torn tail (a frame that does
    /// not fit, or fails its crc with nothing valid after it) is cut off; a damaged frame inside
    /// a segment keeps the records whose text still reads as one, and is rewritten with the rest
    /// zeroed; a packed frame no context reads has its payload zeroed.
    private func replay() throws {
        var replay = QueueIndex.Replay()
        for n in log.numbers {
            guard let bytes = try readSegment(n) else { continue }
            try bytes.withUnsafeBytes { b in
                let (frames, validEnd) = Frame.scan(b, from: Frame.segmentMagic.count)
                if validEnd < b.count {
                    truncatedBytes += b.count - validEnd
                    try log.truncate(n, to: validEnd)
                }
                replay.beginSegment(n)
                for f in frames { try replay.apply(f, in: b) }
            }
        }
        let found = replay.finish()
        index = found.index
        damagedRecords = found.damagedRecords
        for d in found.damaged {
            try rewriteFrame(seg: d.seg, at: d.offset) { pos, r in !index.isLive(pos: pos, seg: d.seg, text: r.lowerBound) }
        }
        // Once: a zeroed payload is skipped.
        for u in found.unreadableFrames where log.sizes[u.frame.seg] != nil {
            let payload = try log.read(u.frame.seg, u.dataStart..<(u.frame.offset + u.frame.length))
            if payload.contains(where: { $0 != 0 }) { try rewriteFrame(seg: u.frame.seg, at: u.frame.offset) { _, _ in true } }
        }
        try reclaim()
    }

    /// The bytes of segment `n` to replay, or nil when it holds nothing: a file this user cannot
    /// read, or without the segment magic, is quarantined; one whose header never reached the
    /// disk is made an empty segment.
    private func readSegment(_ n: UInt32) throws -> [UInt8]? {
        let bytes: [UInt8]
        do {
            bytes = try log.read(n)
        } catch {
            if SegmentLog.isTransient(error) { throw error }
            try log.quarantine(n, reason: "read: \(error)")
            return nil
        }
        if bytes.count >= Frame.segmentMagic.count, bytes.starts(with: Frame.segmentMagic) { return bytes }
        // Bytes that are not a segment's: not this queue's file, set aside whole.
        if bytes.count > Frame.segmentMagic.count && bytes.contains(where: { $0 != 0 }) {
            try log.quarantine(n, reason: "not a segment (no segment magic)")
            return nil
        }
        // Created but its header never reached the disk: nothing in it.
        try log.truncate(n, to: 0)
        try log.overwrite(n, at: 0, Frame.segmentMagic)
        try log.truncate(n, to: Frame.segmentMagic.count)
        return nil
    }

    // MARK: Appending

    /// Starts a new segment when `bytes` more would overflow the active one (the lanes are
    /// declared again in it).
    func prepareSegment(for bytes: Int) throws {
        if log.needsNewSegment(for: bytes) { try log.startSegment() }
        if lanesOf != log.active {
            lanes.removeAll()
            packs.removeAll()
            lanesOf = log.active
        }
    }

    /// Appends records frames for `chunks` (each at the positions given, or new ones from
    /// `nextPosition`) after `prefix` (ledger frames) with one write; returns the records as
    /// placed (not yet in the index).
    func appendChunks(
        _ chunks: [(stream: String, consent: String, chunk: Chunk, positions: [Int64]?, enqueuedMs: Int64)], prefix: [UInt8],
        suffix: [UInt8] = [], sync: Bool = false
    ) throws -> (placed: [Placed], seg: UInt32) {
        var estimate = prefix.count + suffix.count
        for c in chunks { estimate += c.chunk.body.count + 6 * c.chunk.count + 64 + c.stream.utf8.count + c.consent.utf8.count }
        try prepareSegment(for: estimate)
        // Where this write will start (the packed frames' contexts are file offsets).
        let base = log.sizes[log.active] ?? 0
        var out = prefix
        out.reserveCapacity(estimate)
        var newLanes: [LaneKey: UInt64] = [:]
        var placed: [Placed] = []
        var position = index.nextPosition
        // A deflate stream advanced for bytes that never reach the file cannot go on: on any
        // failure every context ends, and the next frames start new ones.
        var packing = false
        defer { if packing { packs.removeAll() } }
        for c in chunks where !c.chunk.isEmpty {
            let lk = LaneKey(stream: c.stream, consent: c.consent)
            let lane: UInt64
            if let l = lanes[lk] ?? newLanes[lk] {
                lane = l
            } else {
                lane = UInt64(lanes.count + newLanes.count)
                newLanes[lk] = lane
                Frame.appendLane(&out, id: lane, stream: c.stream, consent: c.consent)
            }
            let positions = c.positions ?? (0..<Int64(c.chunk.count)).map { position + $0 }
            if c.positions == nil { position += Int64(c.chunk.count) }
            let frameStart = out.count
            var context: UInt32?
            var frameBytes = 0
            var starts: [Int] = []
            if compression == .deflate {
                packing = true
                var pack: Pack
                if let p = packs[lane], p.bytes < UploaderStore.packContextBytes {
                    pack = p
                } else if let p = packs[lane] {
                    pack = Pack(stream: p.stream, start: base + frameStart, seq: 0, bytes: 0)
                    pack.stream.reset()
                } else if packs.count >= UploaderStore.maxOpenPacks, let lru = packs.min(by: { $0.value.used < $1.value.used }) {
                    packs[lru.key] = nil
                    pack = Pack(stream: lru.value.stream, start: base + frameStart, seq: 0, bytes: 0)
                    pack.stream.reset()
                } else {
                    pack = Pack(stream: try LaneDeflate.deflater(), start: base + frameStart, seq: 0, bytes: 0)
                }
                packClock += 1
                pack.used = packClock
                try Frame.appendPacked(
                    &out, lane: lane, positions: positions, enqueuedMs: c.enqueuedMs, chunk: c.chunk, seq: pack.seq, stream: pack.stream)
                context = UInt32(base + frameStart - pack.start)
                frameBytes = out.count - frameStart
                pack.seq += 1
                pack.bytes += c.chunk.body.count
                packs[lane] = pack
                c.chunk.index.withUnsafeBytes { ix in for i in 0..<c.chunk.count { starts.append(Chunk.span(ix, i).lowerBound) } }
            } else {
                starts = Frame.appendRecords(&out, lane: lane, positions: positions, enqueuedMs: c.enqueuedMs, chunk: c.chunk)
            }
            let cid = index.consentID(c.consent)
            c.chunk.body.withUnsafeBytes { body in
                c.chunk.index.withUnsafeBytes { ix in
                    for i in 0..<c.chunk.count {
                        let span = Chunk.span(ix, i)
                        let id = RecordText.escapedID(UnsafeRawBufferPointer(rebasing: body[span]))!
                        placed.append(
                            Placed(
                                stream: c.stream, consent: cid, pos: positions[i], frame: frameStart, text: starts[i],
                                len: Int32(span.count),
                                key: RecordKey(id), enqueuedMs: c.enqueuedMs,
                                place: context.map {
                                    .packed(
                                        context: $0,
                                        share: Rec.share(frameBytes: frameBytes, textBytes: c.chunk.body.count, len: span.count))
                                } ?? .plain))
                    }
                }
            }
        }
        out.append(contentsOf: suffix)
        let at = try log.append(out, sync: sync)
        guard at == base else { throw QueueError(message: "segment \(log.active): appended at \(at), not at its end \(base)") }
        packing = false
        lanes.merge(newLanes) { a, _ in a }
        index.nextPosition = position
        for i in placed.indices {
            placed[i].frame += at
            if placed[i].place == .plain { placed[i].text += at }
        }
        return (placed, log.active)
    }

    /// Puts appended records in the index.
    func insert(_ placed: [Placed], seg: UInt32) { index.insert(placed, seg: seg) }

    // MARK: Group commit

    /// One enqueue call of a group commit.
    struct Enqueue {
        var stream: String
        var consent: String
        var records: [PendingRecord]
    }

    /// Stores the enqueues of one group commit with one write (and one fdatasync with `fsync:
    /// full`): per (stream, switch) one records frame (more past `Chunk.targetBytes`), after the
    /// `done` frame of the delivered batches waiting (`deleteDelivered`), so their ids may come
    /// again in this commit. Returns, per enqueue, how many records were new and their bytes (a
    /// record whose id is already queued in its stream, or earlier in the same commit, is a
    /// duplicate: a retried enqueue is idempotent). Nothing is stored or deleted, and the
    /// duplicate check is unchanged, when it throws.
    func commit(_ enqueues: [Enqueue], nowMs: Int64) throws -> [(added: Int, bytes: Int)] {
        guard !enqueues.isEmpty || !deliveredQueue.isEmpty else { return [] }
        // The delivered batches' ids leave the duplicate check first (restored on failure).
        // A non-mutating call on the index may copy it (a retain per table, seen in `perf`):
        // skipped when no delivery waits, as in most commits.
        let gone = deliveredQueue.isEmpty ? [] : index.recordKeys(ofBatches: deliveredQueue)
        for g in gone { index.forget(g.keys, of: g.stream) }
        // Delivered ids stay duplicates for a while (`DeliveredIds`), this commit's included.
        for g in gone where !g.keys.isEmpty { index.delivered[g.stream, default: DeliveredIds()].add(g.keys) }
        let built = build(enqueues)
        var prefix: [UInt8] = []
        if !deliveredQueue.isEmpty { Frame.appendEnded(&prefix, index.ended(deliveredQueue), zeroed: false) }
        do {
            let r = try appendChunks(built.chunks.map { ($0.stream, $0.consent, $0.chunk, nil, nowMs) }, prefix: prefix)
            insert(r.placed, seg: r.seg)
        } catch {
            // The new keys out first, then the delivered batches' back: an id of both is on disk.
            var k = 0
            for (e, r) in zip(enqueues, built.results) {
                for key in built.added[k..<(k + r.added)] { index.ids[e.stream]?.remove(key) }
                k += r.added
            }
            for g in gone where !g.keys.isEmpty { index.ids[g.stream, default: []].formUnion(g.keys) }
            throw error
        }
        for key in deliveredQueue { index.removeBatch(key, recordsGone: true) }
        let hadDeliveries = !deliveredQueue.isEmpty
        deliveredQueue.removeAll()
        if hadDeliveries { try reclaim() }
        return built.results
    }

    /// A group commit's records in chunks, after the duplicate check.
    private struct Built {
        var chunks: [(stream: String, consent: String, chunk: Chunk)] = []
        /// The keys added to `ids`, in enqueue order (`results` says how many per enqueue).
        var added: [RecordKey] = []
        var results: [(added: Int, bytes: Int)] = []
    }

    /// Checks the enqueues' ids against the index's `ids` (adding the new ones) and puts the new records in
    /// chunks per (stream, switch).
    private func build(_ enqueues: [Enqueue]) -> Built {
        var b = Built()
        b.results.reserveCapacity(enqueues.count)
        var escaped: [UInt8] = []
        escaped.reserveCapacity(160)
        var bodyEstimate = 0
        for e in enqueues { for r in e.records { bodyEstimate += Int(r.idLength + r.bodyLength) + Chunk.recordOverhead } }
        bodyEstimate = min(bodyEstimate, Chunk.targetBytes + Chunk.recordOverhead + 2 * EnqueueParams.maxIdBytes)
        var current: (stream: String, set: Set<RecordKey>)?
        for e in enqueues {
            if current?.stream != e.stream {
                if let c = current, !c.set.isEmpty { index.ids[c.stream] = c.set }
                current = (e.stream, index.ids.removeValue(forKey: e.stream) ?? [])
            }
            var slot = b.chunks.lastIndex { $0.stream == e.stream && $0.consent == e.consent }
            let recent = index.delivered[e.stream]  // once per enqueue, not per record
            var n = 0
            var bytes = 0
            for r in e.records {
                escaped.removeAll(keepingCapacity: true)
                JSONText.appendString(UnsafeRawBufferPointer(start: r.id, count: Int(r.idLength)), to: &escaped)
                let charge = escaped.withUnsafeBytes { id -> Int? in
                    let key = RecordKey(id)
                    guard recent?.contains(key) != true, current!.set.insert(key).inserted else { return nil }
                    b.added.append(key)
                    if slot == nil || b.chunks[slot!].chunk.isFull {
                        b.chunks.append((e.stream, e.consent, Chunk(reservingBody: bodyEstimate)))
                        slot = b.chunks.count - 1
                    }
                    return b.chunks[slot!].chunk.append(
                        escapedID: id, ts: r.ts,
                        data: UnsafeRawBufferPointer(start: r.body, count: Int(r.bodyLength)))
                }
                if let charge {
                    n += 1
                    bytes += charge
                }
            }
            b.results.append((n, bytes))
        }
        if let c = current, !c.set.isEmpty { index.ids[c.stream] = c.set }
        return b
    }
}

/// Opens the queue of database `path` as the uploader does at start (the replay of its
/// segments), reads every pending batch's body and closes it. Returns what the segment
/// accounting check finds wrong (empty: consistent), or nil when the queue could not be opened
/// (an error, as the uploader would report). For the fuzz target `Fuzz/segment`.
package func fuzzReplayQueue(path: String) -> [String]? {
    guard let store = try? UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: UploaderStore.minSegmentBytes) else {
        return nil
    }
    defer { store.close() }
    for b in store.index.batches.values { _ = try? store.batchBody(b.key, stream: b.stream) }
    return store.segmentUseErrors()
}
