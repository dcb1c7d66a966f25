import CSQLite
import PylonCore
import PylonStore

/// One record of an enqueue, pointing into the request's parsed json-c tree (valid while the
/// request's `Call` is alive and the `data` object is not serialised again): the hot path
/// copies each byte once, into its chunk.
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
/// delivered batches' `done` frame. What is queued is held in memory (positions, places in the
/// files, batches, duplicate keys), rebuilt by replaying the segments at open. The oldest
/// segment is removed once nothing in it is live, or its live part copied forward when it is
/// mostly dead (`reclaim`).
///
/// The SQLite database beside it (`uploader.db`) keeps what is written once per stream or per
/// refused batch: stream owners, saved settings and dead letters.
final class UploaderStore {
    let db: Database
    let log: SegmentLog
    let fsyncEveryCommit: Bool
    /// How new records frames are written: packed (`deflate`) or as they are sent (`none`).
    let compression: QueueCompression

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
    /// At most this many lanes keep a deflate stream open (`Deflater.memoryBytes` each): a frame
    /// of another lane takes the stream of the one written least recently, whose context ends
    /// (its next frame starts a new one). Bounds the memory whatever the number of streams.
    static let maxOpenPacks = 16

    /// Ids of the records on disk, per stream: an enqueue of an id already queued is a duplicate.
    var ids: [String: Set<RecordKey>] = [:]
    /// Ids delivered lately, per stream (`DeliveredIds`): a duplicate too.
    var delivered: [String: DeliveredIds] = [:]
    /// Queue position of the next record.
    var nextPosition: Int64 = 0

    /// A live record: its position, where its text is, and its batch.
    struct Rec {
        var pos: Int64
        var seg: UInt32
        /// A packed record's share of its frame's bytes in the file (`fileBytes`).
        var packedBytes: Int32 = 0
        /// File offsets of its frame and its text.
        var frame: Int
        var text: Int
        var len: Int32
        var consent: Int32
        /// Its batch (`batches`), `-1` while queued, `-2` once gone.
        var batch: Int32 = -1
        /// `-1`: its frame is a records frame and `text` a file offset. Else a packed frame:
        /// `text` is its offset in the frame's inflated texts, and its deflate context starts
        /// `ctx` bytes before `frame` (`contextStart`).
        var ctx: Int32 = -1
        var enqueuedMs: Int64
        var key: RecordKey
        var gone: Bool { batch == -2 }
        var charge: Int { Chunk.charge(textBytes: Int(len)) }
        var packed: Bool { ctx >= 0 }
        var contextStart: Int { frame - Int(ctx) }
        /// What it takes of its segment (`SegmentUse.bytes`, for `reclaim`): its charge, or its
        /// share of its packed frame.
        var fileBytes: Int { packed ? Int(packedBytes) : charge }

        /// A packed record's share of a frame of `frameBytes` holding `textBytes` of texts.
        static func share(frameBytes: Int, textBytes: Int, len: Int) -> Int32 {
            Int32(max(1, frameBytes * len / max(1, textBytes)))
        }
    }

    /// A deflate context: a segment and the offset of its first frame.
    struct Context: Hashable {
        var seg: UInt32
        var start: Int
    }

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

    /// One stream's records in position order (gone ones dropped lazily).
    struct Queue {
        var recs: [Rec] = []
        var goneCount = 0

        /// The first record at or after `pos`.
        func lowerBound(_ pos: Int64) -> Int {
            var lo = 0
            var hi = recs.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if recs[mid].pos < pos { lo = mid + 1 } else { hi = mid }
            }
            return lo
        }

        func index(of pos: Int64) -> Int? {
            let i = lowerBound(pos)
            return i < recs.count && recs[i].pos == pos ? i : nil
        }

        mutating func compactIfSparse() {
            guard goneCount > 64, goneCount * 2 > recs.count else { return }
            recs.removeAll { $0.gone }
            goneCount = 0
        }
    }

    struct Batch {
        var key: String
        var stream: String
        var final: Bool
        var seq: UInt64
        var createdMs: Int64
        var runs: [ClosedRange<Int64>]
        var positions: [Int64]
        /// The segment holding its cut frame.
        var cutSeg: UInt32
    }

    /// What each segment still holds: live records (and the bytes they take of it: their charges,
    /// or their shares of packed frames) and cut frames of live batches.
    struct SegmentUse {
        var recs = 0
        var bytes = 0
        var cuts = 0
    }

    var queues: [String: Queue] = [:]
    var batches: [Int32: Batch] = [:]
    var batchIDs: [String: Int32] = [:]
    private var nextBatchID: Int32 = 0
    private var nextCutSeq: UInt64 = 0
    var consents: [String] = []
    private var consentIDs: [String: Int32] = [:]
    var segmentUse: [UInt32: SegmentUse] = [:]
    /// Lanes declared in the active segment.
    private var lanes: [LaneKey: UInt64] = [:]
    private var lanesOf: UInt32 = 0
    /// The deflate contexts open in the active segment, per lane (freed when it closes).
    private var packs: [UInt64: Pack] = [:]
    private var packClock: UInt64 = 0
    /// Lanes with a deflate stream open (tests).
    var openPacks: Int { packs.count }

    struct LaneKey: Hashable {
        var stream: String
        var consent: String
    }

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
        for (_, b) in batches where try db.query("SELECT 1 FROM dead_letters WHERE batch=? LIMIT 1", [.text(b.key)]).first != nil {
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

    private enum Control {
        case cut(seg: UInt32, key: String, stream: String, final: Bool, seq: UInt64, createdMs: Int64, runs: [ClosedRange<Int64>])
        case final([String])
        case done([Frame.Ended], zeroed: Bool)
        case unbatch([String])
    }

    /// Reads every segment: records into `queues`, then the ledger frames in log order. A torn
    /// tail (a frame that does not fit, or fails its crc with nothing valid after it) is cut
    /// off; a damaged frame inside a segment keeps the records whose text still reads as one,
    /// and is rewritten with the rest zeroed.
    private func replay() throws {
        var seen = Set<Int64>()
        var controls: [Control] = []
        // Runs of batches ended (delivered, purged, set aside): their records are gone whatever
        // their texts read as.
        var endedRuns: [String: [ClosedRange<Int64>]] = [:]
        var damaged: [(seg: UInt32, offset: Int, length: Int)] = []
        var unreadable: [(stream: String, pos: Int64)] = []
        var unreadableFrames: [(seg: UInt32, offset: Int, length: Int, dataStart: Int)] = []
        var maxPos: Int64 = -1
        for n in log.numbers {
            let bytes: [UInt8]
            do {
                bytes = try log.read(n)
            } catch {
                if SegmentLog.isTransient(error) { throw error }
                try log.quarantine(n, reason: "read: \(error)")
                continue
            }
            guard bytes.count >= Frame.segmentMagic.count, bytes.starts(with: Frame.segmentMagic) else {
                // Bytes that are not a segment's: not this queue's file, set aside whole.
                if bytes.count > Frame.segmentMagic.count && bytes.contains(where: { $0 != 0 }) {
                    try log.quarantine(n, reason: "not a segment (no segment magic)")
                    continue
                }
                // Created but its header never reached the disk: nothing in it.
                try log.truncate(n, to: 0)
                try log.overwrite(n, at: 0, Frame.segmentMagic)
                try log.truncate(n, to: Frame.segmentMagic.count)
                continue
            }
            var localLanes: [UInt64: (stream: String, consent: Int32)] = [:]
            // Per lane, its context being read: the inflate stream, where it started, the next
            // frame's seq, and whether a frame of it failed (the rest of it then cannot be read).
            var contexts = PackedContexts()
            let (frames, validEnd) = bytes.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count) }
            if validEnd < bytes.count {
                truncatedBytes += bytes.count - validEnd
                try log.truncate(n, to: validEnd)
            }
            for f in frames {
                if !f.crcOK { damaged.append((n, f.offset, f.length)) }
                switch f.frame {
                case .lane(let id, let stream, let consent)?:
                    localLanes[id] = (stream, consentID(consent))
                case .records(let lane, let first, let ms, let deltas, let lengths, let textStart)?:
                    guard let l = localLanes[lane] else { continue }
                    var pos = first
                    var at = textStart
                    for (i, len) in lengths.enumerated() {
                        if i > 0 { pos += Int64(deltas[i - 1]) }
                        defer { at += len + 1 }
                        maxPos = max(maxPos, pos)
                        guard !seen.contains(pos) else { continue }
                        let text = bytes.withUnsafeBytes { UnsafeRawBufferPointer(rebasing: $0[at..<(at + len)]) }
                        guard let id = RecordText.escapedID(text) else {
                            unreadable.append((l.stream, pos))
                            continue
                        }
                        seen.insert(pos)
                        let rec = Rec(
                            pos: pos, seg: n, frame: f.offset, text: at, len: Int32(len), consent: l.consent, enqueuedMs: ms,
                            key: RecordKey(id))
                        queues[l.stream, default: Queue()].recs.append(rec)
                    }
                case .packed(let lane, let first, let ms, let deltas, let lengths, let seq, let dataStart)?:
                    guard let l = localLanes[lane] else { continue }
                    let texts = try bytes.withUnsafeBytes {
                        try contexts.texts(
                            lane: lane, seq: seq, offset: f.offset, crcOK: f.crcOK,
                            payload: UnsafeRawBufferPointer(rebasing: $0[dataStart..<(f.offset + f.length)]), lengths: lengths)
                    }
                    // A frame its context cannot read (zeroed by a purge, damaged, or after one
                    // such): its payload is zeroed below, whatever of it a decoder could guess.
                    if texts == nil && f.crcOK { unreadableFrames.append((n, f.offset, f.length, dataStart)) }
                    let ctx = contexts.lanes[lane].map { Int32(f.offset - $0.start) } ?? -1
                    var pos = first
                    var at = 0
                    for (i, len) in lengths.enumerated() {
                        if i > 0 { pos += Int64(deltas[i - 1]) }
                        defer { at += len + 1 }
                        maxPos = max(maxPos, pos)
                        guard !seen.contains(pos) else { continue }
                        guard let t = texts,
                            let id = t.withUnsafeBytes({ RecordText.escapedID(UnsafeRawBufferPointer(rebasing: $0[at..<(at + len)])) })
                        else {
                            unreadable.append((l.stream, pos))
                            continue
                        }
                        seen.insert(pos)
                        let share = Rec.share(frameBytes: f.length, textBytes: Frame.textBytes(lengths), len: len)
                        let rec = Rec(
                            pos: pos, seg: n, packedBytes: share, frame: f.offset, text: at, len: Int32(len), consent: l.consent, ctx: ctx,
                            enqueuedMs: ms, key: RecordKey(id))
                        queues[l.stream, default: Queue()].recs.append(rec)
                    }
                case .cut(let key, let stream, let fin, let seq, let ms, let runs)?:
                    // New positions never reuse one a batch names, though its records were in a
                    // quarantined segment (they would join that batch at the next replay).
                    for r in runs { maxPos = max(maxPos, r.upperBound) }
                    controls.append(.cut(seg: n, key: key, stream: stream, final: fin, seq: seq, createdMs: ms, runs: runs))
                case .final(let keys)?: controls.append(.final(keys))
                case .done(let keys, let zeroed)?:
                    controls.append(.done(keys.map { Frame.Ended(key: $0, stream: "", runs: []) }, zeroed: zeroed))
                case .ended(let entries, let zeroed)?:
                    for e in entries { for r in e.runs { maxPos = max(maxPos, r.upperBound) } }
                    controls.append(.done(entries, zeroed: zeroed))
                case .unbatch(let keys)?: controls.append(.unbatch(keys))
                case nil: break
                }
            }
        }
        nextPosition = maxPos + 1
        for name in Array(queues.keys) { queues[name]!.recs.sort { $0.pos < $1.pos } }
        for c in controls {
            switch c {
            case .cut(let seg, let key, let stream, let fin, let seq, let ms, let runs):
                guard batchIDs[key] == nil else { continue }
                var positions: [Int64] = []
                if let q = queues[stream] {
                    for run in runs {
                        var i = q.lowerBound(run.lowerBound)
                        while i < q.recs.count, q.recs[i].pos <= run.upperBound {
                            if q.recs[i].batch == -1 { positions.append(q.recs[i].pos) }
                            i += 1
                        }
                    }
                }
                addBatch(
                    Batch(key: key, stream: stream, final: fin, seq: seq, createdMs: ms, runs: runs, positions: positions, cutSeg: seg))
                nextCutSeq = max(nextCutSeq, seq + 1)
            case .final(let keys): for k in keys { if let id = batchIDs[k] { batches[id]!.final = true } }
            case .done(let entries, _):
                for e in entries {
                    if let id = batchIDs[e.key], let b = batches[id] {
                        endedRuns[b.stream, default: []] += b.runs
                        removeBatch(e.key, recordsGone: true)
                        continue
                    }
                    // Its cut frame is gone with an older segment: its records end by their runs.
                    endedRuns[e.stream, default: []] += e.runs
                    guard var q = queues.removeValue(forKey: e.stream) else { continue }
                    for run in e.runs {
                        var i = q.lowerBound(run.lowerBound)
                        while i < q.recs.count, q.recs[i].pos <= run.upperBound {
                            if q.recs[i].batch == -1 { q.recs[i].batch = -2 }
                            i += 1
                        }
                    }
                    queues[e.stream] = q
                }
            case .unbatch(let keys): for k in keys { removeBatch(k, recordsGone: false) }
            }
        }
        // Texts that do not read as records: zeroed by a purge (a packed context is zeroed whole,
        // its delivered records' texts too) or damaged (then lost, and counted, unless ended or
        // read elsewhere: a forward copy; a position counts once).
        damagedRecords =
            unreadable.filter { u in !seen.contains(u.pos) && !(endedRuns[u.stream] ?? []).contains { $0.contains(u.pos) } }
            .count
        for (name, var q) in queues {
            q.recs.removeAll { $0.gone }
            q.goneCount = 0
            queues[name] = q
        }
        // Counted afresh: applying the ledger above decremented counts it had not made.
        segmentUse.removeAll()
        for (name, q) in queues {
            var set = Set<RecordKey>()
            for r in q.recs {
                set.insert(r.key)
                segmentUse[r.seg, default: SegmentUse()].recs += 1
                segmentUse[r.seg, default: SegmentUse()].bytes += r.fileBytes
            }
            if !set.isEmpty { ids[name] = set }
        }
        for (_, b) in batches { segmentUse[b.cutSeg, default: SegmentUse()].cuts += 1 }
        // Damaged frames: rewritten with what is not live zeroed and a crc that matches.
        for d in damaged { try rewriteFrame(seg: d.seg, at: d.offset) { pos, r in !isLive(pos: pos, seg: d.seg, text: r.lowerBound) } }
        // Packed frames no context reads: their payload zeroed (once: a zeroed one is skipped).
        for u in unreadableFrames where log.sizes[u.seg] != nil {
            let payload = try log.read(u.seg, u.dataStart..<(u.offset + u.length))
            if payload.contains(where: { $0 != 0 }) { try rewriteFrame(seg: u.seg, at: u.offset) { _, _ in true } }
        }
        try reclaim()
    }

    func consentID(_ name: String) -> Int32 {
        if let id = consentIDs[name] { return id }
        let id = Int32(consents.count)
        consents.append(name)
        consentIDs[name] = id
        return id
    }

    private func addBatch(_ b: Batch) {
        let id = nextBatchID
        nextBatchID += 1
        batchIDs[b.key] = id
        batches[id] = b
        guard var q = queues[b.stream] else { return }
        queues[b.stream] = nil
        for p in b.positions { if let i = q.index(of: p) { q.recs[i].batch = id } }
        queues[b.stream] = q
    }

    /// Batch `key` leaves the ledger: its records gone (delivered, purged, set aside) or queued
    /// again. Returns the keys of the records gone.
    @discardableResult
    private func removeBatch(_ key: String, recordsGone: Bool) -> [RecordKey] {
        guard let id = batchIDs.removeValue(forKey: key), let b = batches.removeValue(forKey: id) else { return [] }
        if var use = segmentUse[b.cutSeg] {
            use.cuts -= 1
            segmentUse[b.cutSeg] = use
        }
        guard var q = queues.removeValue(forKey: b.stream) else { return [] }
        var gone: [RecordKey] = []
        for p in b.positions {
            guard let i = q.index(of: p), q.recs[i].batch == id else { continue }
            if recordsGone {
                let r = q.recs[i]
                gone.append(r.key)
                q.recs[i].batch = -2
                q.goneCount += 1
                var use = segmentUse[r.seg] ?? SegmentUse()
                use.recs -= 1
                use.bytes -= r.fileBytes
                segmentUse[r.seg] = use
            } else {
                q.recs[i].batch = -1
            }
        }
        q.compactIfSparse()
        if q.recs.count > q.goneCount { queues[b.stream] = q }
        return gone
    }

    // MARK: Appending

    /// Starts a new segment when `bytes` more would overflow the active one (the lanes are
    /// declared again in it).
    private func prepareSegment(for bytes: Int) throws {
        if log.needsNewSegment(for: bytes) { try log.startSegment() }
        if lanesOf != log.active {
            lanes.removeAll()
            packs.removeAll()
            lanesOf = log.active
        }
    }

    /// A record to place: its text in `chunk`, appended at `position`.
    struct Placed {
        var stream: String
        var consent: Int32
        var pos: Int64
        var frame: Int
        var text: Int
        var len: Int32
        var key: RecordKey
        var enqueuedMs: Int64
        var ctx: Int32 = -1
        var packedBytes: Int32 = 0
    }

    /// Appends records frames for `chunks` (each at the positions given, or new ones from
    /// `nextPosition`) after `prefix` (ledger frames) with one write; returns the records as
    /// placed (not yet in `queues`).
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
        var position = nextPosition
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
            var ctx: Int32 = -1
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
                    pack = Pack(stream: try Deflater(), start: base + frameStart, seq: 0, bytes: 0)
                }
                packClock += 1
                pack.used = packClock
                try Frame.appendPacked(
                    &out, lane: lane, positions: positions, enqueuedMs: c.enqueuedMs, chunk: c.chunk, seq: pack.seq, stream: pack.stream)
                ctx = Int32(base + frameStart - pack.start)
                frameBytes = out.count - frameStart
                pack.seq += 1
                pack.bytes += c.chunk.body.count
                packs[lane] = pack
                c.chunk.index.withUnsafeBytes { ix in for i in 0..<c.chunk.count { starts.append(Chunk.span(ix, i).lowerBound) } }
            } else {
                starts = Frame.appendRecords(&out, lane: lane, positions: positions, enqueuedMs: c.enqueuedMs, chunk: c.chunk)
            }
            let cid = consentID(c.consent)
            c.chunk.body.withUnsafeBytes { body in
                c.chunk.index.withUnsafeBytes { ix in
                    for i in 0..<c.chunk.count {
                        let span = Chunk.span(ix, i)
                        let id = RecordText.escapedID(UnsafeRawBufferPointer(rebasing: body[span]))!
                        placed.append(
                            Placed(
                                stream: c.stream, consent: cid, pos: positions[i], frame: frameStart, text: starts[i],
                                len: Int32(span.count),
                                key: RecordKey(id), enqueuedMs: c.enqueuedMs, ctx: ctx,
                                packedBytes: Rec.share(frameBytes: frameBytes, textBytes: c.chunk.body.count, len: span.count)))
                    }
                }
            }
        }
        out.append(contentsOf: suffix)
        let at = try log.append(out, sync: sync)
        guard at == base else { throw QueueError(message: "segment \(log.active): appended at \(at), not at its end \(base)") }
        packing = false
        lanes.merge(newLanes) { a, _ in a }
        nextPosition = position
        for i in placed.indices {
            placed[i].frame += at
            if placed[i].ctx < 0 { placed[i].text += at }
        }
        return (placed, log.active)
    }

    /// Puts appended records in their streams' queues (new positions: at the ends).
    func insert(_ placed: [Placed], seg: UInt32) {
        var i = 0
        while i < placed.count {
            let stream = placed[i].stream
            var q = queues.removeValue(forKey: stream) ?? Queue()
            while i < placed.count, placed[i].stream == stream {
                let p = placed[i]
                let rec = Rec(
                    pos: p.pos, seg: seg, packedBytes: p.packedBytes, frame: p.frame, text: p.text, len: p.len, consent: p.consent,
                    ctx: p.ctx, enqueuedMs: p.enqueuedMs, key: p.key)
                q.recs.append(rec)
                var use = segmentUse[seg] ?? SegmentUse()
                use.recs += 1
                use.bytes += rec.fileBytes
                segmentUse[seg] = use
                i += 1
            }
            queues[stream] = q
        }
    }

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
        var gone: [(stream: String, keys: [RecordKey])] = []
        for key in deliveredQueue {
            guard let id = batchIDs[key], let b = batches[id], let q = queues[b.stream] else { continue }
            let keys = b.positions.compactMap { p in q.index(of: p).map { q.recs[$0].key } }
            gone.append((b.stream, keys))
            forget(keys, of: b.stream)
        }
        // Delivered ids stay duplicates for a while (`DeliveredIds`), this commit's included.
        for g in gone where !g.keys.isEmpty { delivered[g.stream, default: DeliveredIds()].add(g.keys) }
        let built = build(enqueues)
        var prefix: [UInt8] = []
        if !deliveredQueue.isEmpty { Frame.appendEnded(&prefix, ended(deliveredQueue), zeroed: false) }
        do {
            let r = try appendChunks(built.chunks.map { ($0.stream, $0.consent, $0.chunk, nil, nowMs) }, prefix: prefix)
            insert(r.placed, seg: r.seg)
        } catch {
            // The new keys out first, then the delivered batches' back: an id of both is on disk.
            var k = 0
            for (e, r) in zip(enqueues, built.results) {
                for key in built.added[k..<(k + r.added)] { ids[e.stream]?.remove(key) }
                k += r.added
            }
            for g in gone where !g.keys.isEmpty { ids[g.stream, default: []].formUnion(g.keys) }
            throw error
        }
        for key in deliveredQueue { removeBatch(key, recordsGone: true) }
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

    /// Checks the enqueues' ids against `ids` (adding the new ones) and puts the new records in
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
                if let c = current, !c.set.isEmpty { ids[c.stream] = c.set }
                current = (e.stream, ids.removeValue(forKey: e.stream) ?? [])
            }
            var slot = b.chunks.lastIndex { $0.stream == e.stream && $0.consent == e.consent }
            let recent = delivered[e.stream]  // once per enqueue, not per record
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
        if let c = current, !c.set.isEmpty { ids[c.stream] = c.set }
        return b
    }

    // MARK: Batches

    /// Assigns the oldest queued records of `stream` (same consent switch, at most `maxCount`
    /// and `maxBytes`, at least one) to a new batch `key`, whose cut frame is written before
    /// anything is sent. Returns the number of records in it and their bytes (0 when nothing
    /// was queued).
    func cutBatch(
        stream: String, key: String, maxCount: Int, maxBytes: Int, final: Bool, consent: String? = nil,
        nowMs: Int64
    ) throws -> (count: Int, bytes: Int) {
        guard let q = queues[stream] else { return (0, 0) }
        let only = consent.flatMap { consentIDs[$0] }
        if consent != nil, only == nil { return (0, 0) }
        var switchID = only
        var positions: [Int64] = []
        var runs: [ClosedRange<Int64>] = []
        var runStart: Int64?
        var runEnd: Int64 = 0
        var bytes = 0
        for r in q.recs where !r.gone {
            let take: Bool
            if r.batch != -1 {
                take = false
            } else if let s = switchID, r.consent != s {
                if only == nil { break }  // the oldest records' switch only
                take = false
            } else {
                let c = r.charge
                if positions.count == maxCount || (!positions.isEmpty && bytes + c > maxBytes) { break }
                take = true
                switchID = r.consent
                positions.append(r.pos)
                bytes += c
            }
            if take {
                if runStart == nil { runStart = r.pos }
                runEnd = r.pos
            } else if let s = runStart {
                runs.append(s...runEnd)
                runStart = nil
            }
        }
        if let s = runStart { runs.append(s...runEnd) }
        guard !positions.isEmpty else { return (0, 0) }
        var out: [UInt8] = []
        let seq = nextCutSeq
        Frame.appendCut(&out, key: key, stream: stream, final: final, seq: seq, createdMs: nowMs, runs: runs)
        try prepareSegment(for: out.count)
        try log.append(out)
        nextCutSeq += 1
        let b = Batch(
            key: key, stream: stream, final: final, seq: seq, createdMs: nowMs, runs: runs, positions: positions, cutSeg: log.active)
        addBatch(b)
        segmentUse[log.active, default: SegmentUse()].cuts += 1
        return (positions.count, bytes)
    }

    /// The live records of batch `key`, in position order.
    func records(ofBatch key: String) -> [Rec] {
        guard let id = batchIDs[key], let b = batches[id], let q = queues[b.stream] else { return [] }
        return b.positions.compactMap { p in q.index(of: p).flatMap { q.recs[$0].batch == id ? q.recs[$0] : nil } }
    }

    /// The texts of `recs` (each record's upload form), in their order: a records frame's read
    /// with one pread per run of records that lie close together in one segment; a packed
    /// frame's by inflating its context from its first frame (one pread per context, each
    /// context inflated once).
    func texts(_ recs: [Rec], _ each: (UnsafeRawBufferPointer) -> Void) throws {
        var needed: [Context: Set<Int>] = [:]
        for r in recs where r.packed { needed[Context(seg: r.seg, start: r.contextStart), default: []].insert(r.frame) }
        var inflated: [Context: [Int: [UInt8]]] = [:]
        for (c, frames) in needed { inflated[c] = try inflateContext(c, frames: frames) }
        var i = 0
        while i < recs.count {
            if recs[i].packed {
                let r = recs[i]
                guard let t = inflated[Context(seg: r.seg, start: r.contextStart)]?[r.frame], r.text + Int(r.len) <= t.count else {
                    throw QueueError(message: "segment \(r.seg): no packed frame at \(r.frame)")
                }
                t.withUnsafeBytes { each(UnsafeRawBufferPointer(rebasing: $0[r.text..<(r.text + Int(r.len))])) }
                i += 1
                continue
            }
            var j = i
            while j < recs.count, !recs[j].packed { j += 1 }
            try plainTexts(recs[i..<j], each)
            i = j
        }
    }

    private func plainTexts(_ recs: ArraySlice<Rec>, _ each: (UnsafeRawBufferPointer) -> Void) throws {
        var i = recs.startIndex
        while i < recs.endIndex {
            let seg = recs[i].seg
            let start = recs[i].text
            var end = start + Int(recs[i].len)
            var j = i + 1
            var useful = Int(recs[i].len)
            while j < recs.endIndex, recs[j].seg == seg, recs[j].text >= end,
                recs[j].text + Int(recs[j].len) - start <= 2 * (useful + Int(recs[j].len)) + 4096
            {
                end = recs[j].text + Int(recs[j].len)
                useful += Int(recs[j].len)
                j += 1
            }
            let bytes = try log.read(seg, start..<end)
            bytes.withUnsafeBytes { b in
                for k in i..<j {
                    let o = recs[k].text - start
                    each(UnsafeRawBufferPointer(rebasing: b[o..<(o + Int(recs[k].len))]))
                }
            }
            i = j
        }
    }

    /// Where the last read of a context stopped: its inflate stream after the last frame read,
    /// that frame's end, its lane and the next `seq`. Batches are read in queue order, so the
    /// next read of the same context usually goes on from there instead of from its first frame.
    /// Dropped when a frame is rewritten or a segment removed.
    private var readCursor: (c: Context, next: Int, lane: UInt64, seq: UInt64, inflater: Inflater)?

    /// The inflated texts of the packed frames at `frames` of context `c`: its frames are read
    /// with one pread, from its first (or where the last read of it stopped, when that is
    /// before all of `frames`) to the last of `frames`, and inflated in order.
    private func inflateContext(_ c: Context, frames: Set<Int>) throws -> [Int: [UInt8]] {
        guard let firstNeeded = frames.min(), let last = frames.max() else { return [:] }
        var from = c.start
        var lane: UInt64?
        var seq: UInt64 = 0
        let inflater: Inflater
        if let k = readCursor, k.c == c, k.next <= firstNeeded {
            (from, lane, seq, inflater) = (k.next, k.lane, k.seq, k.inflater)
        } else {
            inflater = try Inflater()
        }
        readCursor = nil
        let head = try log.read(c.seg, last..<(last + Frame.headBytes))
        let end = last + Frame.headBytes + Int(Chunk.u32(head, 0))
        let bytes = try log.read(c.seg, from..<end)
        let broken = QueueError(message: "segment \(c.seg): the deflate context at \(c.start) does not inflate")
        var out: [Int: [UInt8]] = [:]
        try bytes.withUnsafeBytes { b in
            var at = 0
            while at + Frame.headBytes <= b.count, out.count < frames.count {
                let n = Int(Chunk.u32(b, at))
                guard n > 0, at + Frame.headBytes + n <= b.count else { throw broken }
                let body = UnsafeRawBufferPointer(rebasing: b[(at + Frame.headBytes)..<(at + Frame.headBytes + n)])
                defer { at += Frame.headBytes + n }
                guard let first = body.first, first == Frame.Kind.packed.rawValue,
                    case .packed(let l, _, _, _, let lengths, let s, let dataStart)? = Frame.decode(body, bodyStart: at + Frame.headBytes),
                    lane == nil || l == lane
                else { continue }
                guard s == seq, Frame.crc32(of: body) == Chunk.u32(b, at + 4) else { throw broken }
                lane = l
                seq += 1
                let payload = UnsafeRawBufferPointer(rebasing: b[dataStart..<(at + Frame.headBytes + n)])
                guard let t = inflater.inflate(payload, expected: Frame.textBytes(lengths)) else { throw broken }
                if frames.contains(from + at) { out[from + at] = t }
            }
        }
        guard out.count == frames.count, let lane else { throw broken }
        readCursor = (c, end, lane, seq, inflater)
        return out
    }

    /// The upload body of batch `key`: `{"batch","stream","records":[{"id","ts","data"}]}`, its
    /// records' texts as stored. Also returns the record count and what they count in the disk
    /// cap.
    func batchBody(_ key: String, stream: String) throws -> (body: [UInt8], count: Int, recordBytes: Int) {
        let recs = records(ofBatch: key)
        var out: [UInt8] = []
        out.reserveCapacity(recs.reduce(64) { $0 + Int($1.len) + 1 })
        out.append(contentsOf: #"{"batch":"#.utf8)
        JSONText.appendString(key, to: &out)
        out.append(contentsOf: #","stream":"#.utf8)
        JSONText.appendString(stream, to: &out)
        out.append(contentsOf: #","records":["#.utf8)
        var first = true
        try texts(recs) { t in
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            out.append(contentsOf: t)
        }
        out.append(contentsOf: "]}".utf8)
        return (out, recs.count, recs.reduce(0) { $0 + $1.charge })
    }

    func isFinal(_ key: String) throws -> Bool { batchIDs[key].flatMap { batches[$0]?.final } ?? false }

    /// Delivered (or a final batch that is purged whatever happened): the records are gone, and
    /// their ids may be enqueued again. `zero`: their texts are overwritten with zeros in the
    /// segment files and fdatasynced (records purged because consent was denied, or set aside).
    func deleteBatch(_ key: String, zero: Bool = false) throws {
        guard batchIDs[key] != nil else { return }
        let recs = zero ? records(ofBatch: key) : []
        var out: [UInt8] = []
        Frame.appendEnded(&out, ended([key]), zeroed: zero)
        try prepareSegment(for: out.count)
        try log.append(out, sync: zero)
        let stream = batches[batchIDs[key]!]!.stream
        let gone = removeBatch(key, recordsGone: true)
        forget(gone, of: stream)
        if zero { try zeroTexts(recs) }
        try reclaim()
    }

    /// Overwrites the texts of `recs` (gone already) with zeros: each records frame holding one
    /// is rewritten with its crc recomputed; a packed frame's text cannot be zeroed alone (the
    /// later frames of its context depend on it), so the live records of every context holding
    /// one are copied forward first (fdatasynced), then every frame of those contexts has its
    /// whole deflated payload zeroed. Then each segment touched is fdatasynced.
    func zeroTexts(_ recs: [Rec]) throws {
        var touched = Set<UInt32>()
        for c in try copyCompanionsForward(recs).sorted(by: { ($0.seg, $0.start) < ($1.seg, $1.start) }) {
            try zeroContext(c)
            touched.insert(c.seg)
        }
        var byFrame: [Int: (seg: UInt32, ranges: [Range<Int>])] = [:]
        var order: [(UInt32, Int)] = []
        for r in recs where !r.packed {
            let k = r.frame ^ (Int(r.seg) << 40)
            if byFrame[k] == nil {
                byFrame[k] = (r.seg, [])
                order.append((r.seg, r.frame))
            }
            byFrame[k]!.ranges.append(r.text..<(r.text + Int(r.len)))
        }
        for (seg, frame) in order {
            let ranges = byFrame[frame ^ (Int(seg) << 40)]!.ranges
            try rewriteFrame(seg: seg, at: frame, sync: false) { _, r in ranges.contains(r) }
            touched.insert(seg)
        }
        for s in touched.sorted() { try log.sync(s) }
    }

    /// The deflate contexts holding packed records of `recs`, once every live record sharing
    /// one with them (but `recs`) is copied forward, fdatasynced, to new contexts: the first step
    /// of zeroing them.
    func copyCompanionsForward(_ recs: [Rec]) throws -> Set<Context> {
        let contexts = Set(recs.filter(\.packed).map { Context(seg: $0.seg, start: $0.contextStart) })
        guard !contexts.isEmpty else { return [] }
        let purged = Set(recs.map(\.pos))
        // The copies go to new contexts, never to one about to be zeroed.
        packs.removeAll()
        _ = try copyRecordsForward(suffix: []) {
            $0.packed && !purged.contains($0.pos) && contexts.contains(Context(seg: $0.seg, start: $0.contextStart))
        }
        return contexts
    }

    /// How much of a segment `zeroContext` reads at a time (tests: less).
    var zeroReadWindow = 256 << 10

    /// Zeroes the deflated payload of every frame of context `c` (its lane's packed frames from
    /// `c.start` up to the lane's next context), in order, each with its crc recomputed; not
    /// fdatasynced.
    private func zeroContext(_ c: Context) throws {
        guard let size = log.sizes[c.seg], c.start < size else { return }
        // Read in windows: a context ends long before its segment does, mostly.
        let window = zeroReadWindow
        var buf: [UInt8] = []
        var bufStart = c.start
        var lane: UInt64?
        var taken = 0
        var at = c.start
        while at + Frame.headBytes <= size, taken < UploaderStore.packContextBytes {
            if at + Frame.headBytes > bufStart + buf.count {
                bufStart = at
                buf = try log.read(c.seg, at..<min(size, at + window))
            }
            let n = Int(Chunk.u32(buf, at - bufStart))
            guard n > 0, at + Frame.headBytes + n <= size else { break }
            if at + Frame.headBytes + n > bufStart + buf.count {
                bufStart = at
                buf = try log.read(c.seg, at..<min(size, at + max(window, Frame.headBytes + n)))
            }
            defer { at += Frame.headBytes + n }
            let o = at - bufStart + Frame.headBytes
            let decoded = buf.withUnsafeBytes { Frame.decode(UnsafeRawBufferPointer(rebasing: $0[o..<(o + n)]), bodyStart: 0) }
            guard case .packed(let l, _, _, _, let lengths, let seq, _)? = decoded, lane == nil || l == lane else { continue }
            if lane != nil && seq == 0 { break }
            lane = l
            // The writer starts a new context once this one has taken `packContextBytes`.
            taken += Frame.textBytes(lengths)
            try rewriteFrame(seg: c.seg, at: at, sync: false) { _, _ in true }
        }
    }

    /// Rewrites the records frame at `offset` of segment `seg` with the texts `zeroing` picks
    /// (by position and file range) overwritten with zeros, and its crc recomputed. A packed
    /// frame has its whole deflated payload zeroed (its texts cannot be zeroed one by one); any
    /// other frame has its crc recomputed only.
    private func rewriteFrame(seg: UInt32, at offset: Int, sync: Bool = true, zeroing: (Int64, Range<Int>) -> Bool) throws {
        guard log.sizes[seg] != nil else { return }
        let head = try log.read(seg, offset..<(offset + Frame.headBytes))
        let n = Int(Chunk.u32(head, 0))
        var frame = try log.read(seg, offset..<(offset + Frame.headBytes + n))
        let decoded = frame.withUnsafeBytes {
            Frame.decode(UnsafeRawBufferPointer(rebasing: $0[Frame.headBytes...]), bodyStart: offset + Frame.headBytes)
        }
        if case .records(_, let first, _, let deltas, let lengths, let textStart)? = decoded {
            var pos = first
            var at = textStart
            for (i, len) in lengths.enumerated() {
                if i > 0 { pos += Int64(deltas[i - 1]) }
                if zeroing(pos, at..<(at + len)) { for k in (at - offset)..<(at - offset + len) { frame[k] = 0 } }
                at += len + 1
            }
        } else if case .packed(_, _, _, _, _, _, let dataStart)? = decoded {
            for k in (dataStart - offset)..<frame.count { frame[k] = 0 }
        }
        Frame.seal(&frame, at: 0)
        readCursor = nil
        try log.overwrite(seg, at: offset, frame)
        if sync { try log.sync(seg) }
    }

    /// Whether a live record has its text at `text` of segment `seg`.
    private func isLive(pos: Int64, seg: UInt32, text: Int) -> Bool {
        for (_, q) in queues {
            if let i = q.index(of: pos), !q.recs[i].gone, q.recs[i].seg == seg, q.recs[i].text == text { return true }
        }
        return false
    }

    /// What a `done` frame says of batches `keys`: each with its stream and runs.
    func ended(_ keys: [String]) -> [Frame.Ended] {
        keys.compactMap { k in batchIDs[k].flatMap { batches[$0] }.map { Frame.Ended(key: k, stream: $0.stream, runs: $0.runs) } }
    }

    /// Delivered batches whose `done` frame waits for the next group commit (`deleteDelivered`).
    private(set) var deliveredQueue: [String] = []

    /// Batch `key` was delivered: its `done` frame joins the next group commit's write
    /// (`commit`), or `applyDeliveredDeletes` when none comes. Until then the batch is on disk:
    /// its ids are still duplicates, and a crash before it makes the batch go again after the
    /// restart (the backend keeps it once, by its key).
    func deleteDelivered(_ key: String) { deliveredQueue.append(key) }

    /// Writes the `done` frame of the delivered batches waiting, on its own.
    func applyDeliveredDeletes() throws {
        guard !deliveredQueue.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendEnded(&out, ended(deliveredQueue), zeroed: false)
        try prepareSegment(for: out.count)
        try log.append(out)
        for key in deliveredQueue {
            guard let id = batchIDs[key], let stream = batches[id]?.stream else { continue }
            let keys = removeBatch(key, recordsGone: true)
            forget(keys, of: stream)
            delivered[stream, default: DeliveredIds()].add(keys)
        }
        deliveredQueue.removeAll()
        try reclaim()
    }

    /// Records of `stream` left the disk: their ids may be enqueued again.
    func forget(_ gone: [RecordKey], of stream: String) {
        guard var set = ids.removeValue(forKey: stream) else { return }
        for k in gone { set.remove(k) }
        if !set.isEmpty { ids[stream] = set }
    }

    /// Dissolves batches, with one frame, so their records are cut again (after a 413): they
    /// are queued again at their places.
    func unbatch(_ keys: [String]) throws {
        let known = keys.filter { batchIDs[$0] != nil }
        guard !known.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendKeys(&out, .unbatch, known)
        try prepareSegment(for: out.count)
        try log.append(out)
        for k in known { removeBatch(k, recordsGone: false) }
        try reclaim()
    }

    private func markFinal(_ keys: [String]) throws {
        guard !keys.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendKeys(&out, .final, keys)
        try prepareSegment(for: out.count)
        try log.append(out)
        for k in keys { batches[batchIDs[k]!]!.final = true }
    }

    /// Marks every pending batch holding records under `consent` final (sent once, no retry).
    func markFinal(consent: String) throws {
        guard let c = consentIDs[consent] else { return }
        var keys: [String] = []
        for (id, b) in batches where !b.final {
            if records(ofBatch: b.key).contains(where: { $0.consent == c }) { keys.append(batches[id]!.key) }
        }
        try markFinal(keys)
    }

    /// Marks every pending batch of `stream` final.
    func markFinal(stream: String) throws {
        try markFinal(batches.values.filter { $0.stream == stream && !$0.final }.map(\.key))
    }

    /// The consent switches records are stored under.
    func consentKeys() throws -> [String] {
        var used = Set<Int32>()
        for q in queues.values { for r in q.recs where !r.gone { used.insert(r.consent) } }
        return used.map { consents[Int($0)] }
    }

    /// Streams with queued records under `consent`.
    func streams(withConsent consent: String) throws -> [String] {
        guard let c = consentIDs[consent] else { return [] }
        return queues.compactMap { name, q in q.recs.contains { $0.batch == -1 && $0.consent == c } ? name : nil }
    }

    struct StreamSummary {
        var queued = 0
        var queuedBytes = 0
        var oldestMs: Int64?
        var pendingBatches: [String] = []
    }

    /// What is on disk per stream (at start-up, and for status).
    func summaries() throws -> [String: StreamSummary] {
        var out: [String: StreamSummary] = [:]
        for (name, q) in queues {
            var s = StreamSummary()
            for r in q.recs where r.batch == -1 {
                s.queued += 1
                s.queuedBytes += r.charge
                s.oldestMs = min(s.oldestMs ?? r.enqueuedMs, r.enqueuedMs)
            }
            if s.queued > 0 { out[name] = s }
        }
        // In the order they were cut, not by the wall clock, which may have stepped back.
        for b in batches.values.sorted(by: { $0.seq < $1.seq }) { out[b.stream, default: StreamSummary()].pendingBatches.append(b.key) }
        return out
    }

    /// Bytes of records on disk per stream (queued or in a batch).
    func streamBytes() throws -> [String: Int] {
        var out: [String: Int] = [:]
        for (name, q) in queues {
            let n = q.recs.reduce(0) { $0 + ($1.gone ? 0 : $1.charge) }
            if n > 0 { out[name] = n }
        }
        return out
    }

    func totalBytes() throws -> Int { try streamBytes().values.reduce(0, +) }

    // MARK: Reclaiming segments

    /// What `segmentUse` should hold, counted from scratch, where it differs (tests).
    func segmentUseErrors() -> [String] {
        var want: [UInt32: SegmentUse] = [:]
        for q in queues.values {
            for r in q.recs where !r.gone {
                want[r.seg, default: SegmentUse()].recs += 1
                want[r.seg, default: SegmentUse()].bytes += r.fileBytes
            }
        }
        for b in batches.values { want[b.cutSeg, default: SegmentUse()].cuts += 1 }
        var out: [String] = []
        for seg in Set(want.keys).union(segmentUse.keys) {
            let w = want[seg] ?? SegmentUse(), h = segmentUse[seg] ?? SegmentUse()
            if (w.recs, w.bytes, w.cuts) != (h.recs, h.bytes, h.cuts) { out.append("segment \(seg): counted \(h), is \(w)") }
            if w.recs + w.cuts > 0 && log.sizes[seg] == nil { out.append("segment \(seg) removed while live") }
        }
        return out
    }

    /// Removes the oldest segments while nothing in them is live (never the active one); the
    /// oldest one mostly dead is copied forward first (its live records and live cut frames
    /// appended again, fdatasynced), so one stuck record does not keep every later segment.
    /// Only the oldest goes: a `done` frame is never removed while the records it ended are on
    /// disk. Also copied forward, whatever its live part, while the files hold more than twice
    /// the live records plus two segments; and an active segment past a quarter of its size
    /// with nothing live in it is closed, so it goes too.
    func reclaim() throws {
        while let head = log.numbers.first {
            let use = segmentUse[head] ?? SegmentUse()
            let dead = use.recs <= 0 && use.cuts <= 0
            if head == log.active {
                guard dead, log.numbers.count == 1, (log.sizes[head] ?? 0) > log.maxSegmentBytes / 4 else { return }
                try log.startSegment()
                packs.removeAll()  // the closed segment's deflate streams
                continue
            }
            if dead {
                if readCursor?.c.seg == head { readCursor = nil }
                try log.remove(head)
                segmentUse[head] = nil
                continue
            }
            let live = segmentUse.values.reduce(0) { $0 + $1.bytes }
            let pressed = log.fileBytes > 2 * live + 2 * log.maxSegmentBytes
            guard pressed || use.bytes * UploaderStore.compactLiveFraction < (log.sizes[head] ?? 0) else { return }
            try copyForward(head)
        }
    }

    /// Appends segment `seg`'s live records (at their positions) and live cut frames to the
    /// active segment, fdatasynced, and points the queue at the copies.
    private func copyForward(_ seg: UInt32) throws {
        var cuts: [UInt8] = []
        for b in batches.values.sorted(by: { $0.seq < $1.seq }) where b.cutSeg == seg {
            Frame.appendCut(&cuts, key: b.key, stream: b.stream, final: b.final, seq: b.seq, createdMs: b.createdMs, runs: b.runs)
        }
        let to = try copyRecordsForward(suffix: cuts) { $0.seg == seg }
        for (id, b) in batches where b.cutSeg == seg {
            batches[id]!.cutSeg = to
            segmentUse[to, default: SegmentUse()].cuts += 1
        }
        segmentUse[seg] = SegmentUse()
    }

    /// Appends the live records `match` picks (at their positions), then `suffix`, to the
    /// active segment with one write, fdatasynced, and points the queue at the copies. Returns
    /// the segment written to.
    private func copyRecordsForward(suffix: [UInt8], _ match: (Rec) -> Bool) throws -> UInt32 {
        var chunks: [(stream: String, consent: String, chunk: Chunk, positions: [Int64]?, enqueuedMs: Int64)] = []
        for (name, q) in queues.sorted(by: { $0.key < $1.key }) {
            var byConsent: [Int32: [Rec]] = [:]
            for r in q.recs where !r.gone && match(r) { byConsent[r.consent, default: []].append(r) }
            for (c, recs) in byConsent.sorted(by: { $0.key < $1.key }) {
                var i = 0
                while i < recs.count {
                    let part = Array(recs[i..<min(recs.count, i + Chunk.targetRecords)])
                    var chunk = Chunk()
                    try texts(part) { t in chunk.appendText(t) }
                    chunks.append((name, consents[Int(c)], chunk, part.map(\.pos), part.map(\.enqueuedMs).min() ?? 0))
                    i += part.count
                }
            }
        }
        let saved = nextPosition
        let r = try appendChunks(chunks, prefix: [], suffix: suffix, sync: true)
        nextPosition = saved
        for p in r.placed {
            guard var q = queues.removeValue(forKey: p.stream) else { continue }
            if let i = q.index(of: p.pos) {
                let old = q.recs[i]
                q.recs[i].seg = r.seg
                q.recs[i].frame = p.frame
                q.recs[i].text = p.text
                q.recs[i].ctx = p.ctx
                q.recs[i].packedBytes = p.packedBytes
                var use = segmentUse[old.seg] ?? SegmentUse()
                use.recs -= 1
                use.bytes -= old.fileBytes
                segmentUse[old.seg] = use
                segmentUse[r.seg, default: SegmentUse()].recs += 1
                segmentUse[r.seg, default: SegmentUse()].bytes += q.recs[i].fileBytes
            }
            queues[p.stream] = q
        }
        return r.seg
    }

    // MARK: Owners and settings (the database)

    /// Records `owner` as the owner of `stream` (the first writer wins; later calls change nothing).
    func recordOwner(stream: String, owner: String, nowMs: Int64) throws {
        try db.run(
            "INSERT OR IGNORE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
    }

    /// Hands `stream` to `owner` (`uploader.setOwner`), or releases it (nil: the next writer
    /// claims it).
    func setOwner(stream: String, owner: String?, nowMs: Int64) throws {
        if let owner {
            try db.run(
                "INSERT OR REPLACE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
        } else {
            try db.run("DELETE FROM stream_owners WHERE stream = ?", [.text(stream)])
        }
    }

    func recordedOwners() throws -> [String: String] {
        var out: [String: String] = [:]
        for r in try db.query("SELECT stream, owner FROM stream_owners") { out[r[0].text ?? ""] = r[1].text ?? "" }
        return out
    }

    func saveSettings(stream: String, maxCount: Int, intervalMs: UInt64) throws {
        try db.run(
            "INSERT OR REPLACE INTO stream_settings(stream,max_count,interval_ms,endpoint) VALUES(?,?,?,NULL)",
            [.text(stream), .int(Int64(maxCount)), .int(Int64(intervalMs))])
    }

    func savedSettings() throws -> [String: (maxCount: Int, intervalMs: UInt64)] {
        var out: [String: (Int, UInt64)] = [:]
        for r in try db.query("SELECT stream,max_count,interval_ms FROM stream_settings") {
            out[r[0].text ?? ""] = (Int(r[1].int ?? 50), UInt64(r[2].int ?? 10_000))
        }
        return out
    }
}

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

/// Opens the queue of database `path` as the uploader does at start (the replay of its
/// segments), reads every pending batch's body and closes it. Returns what the segment
/// accounting check finds wrong (empty: consistent), or nil when the queue could not be opened
/// (an error, as the uploader would report). For the fuzz target `Fuzz/segment`.
package func fuzzReplayQueue(path: String) -> [String]? {
    guard let store = try? UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: UploaderStore.minSegmentBytes) else {
        return nil
    }
    defer { store.close() }
    for b in store.batches.values { _ = try? store.batchBody(b.key, stream: b.stream) }
    return store.segmentUseErrors()
}
