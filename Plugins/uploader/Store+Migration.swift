import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// Formats 0-3 → 4: the earlier releases kept the records in the database — one row per record
/// in `records` (formats 0 and 1), or one row per group commit in `chunks`/`chunk_bodies` with
/// the records already in the upload form (formats 2 and 3), and the cut batches in `batches`.
/// At the first open by this release:
///
/// 1. every record is written, in queue order, to fresh segments in `uploader.queue.migrating/`
///    (positions 0, 1, … in that order; switches kept), then a cut frame per pending batch (its
///    key, final flag and records kept, so its resend is still the same batch to the backend),
///    and fdatasynced;
/// 2. one transaction drops the old tables (their pages zeroed as they are freed:
///    `secure_delete`) and sets `user_version` to 4; the WAL is checkpointed and truncated;
/// 3. the directory is renamed `uploader.queue/`.
///
/// A crash before 2 leaves the old tables: the next start removes the half-written directory
/// and migrates again. A crash between 2 and 3 leaves format 4 and the directory: the next start
/// renames it.
extension UploaderStore {
    /// Records of an old queue go into records frames of at most this many.
    static let migrationChunkRecords = StreamSettings.maxCountLimit

    static func migrateToSegments(db: Database, version: Int64, dir: String, segmentBytes: Int) throws {
        let tmp = dir + ".migrating"
        func exists(_ p: String) -> Bool { access(p, F_OK) == 0 }
        func table(_ name: String) throws -> Bool {
            try db.query("SELECT name FROM sqlite_master WHERE type='table' AND name=?", [.text(name)]).first != nil
        }
        let hasRecords = try table("records")
        let hasChunks = try table("chunks")
        guard hasRecords || hasChunks else {
            if exists(tmp) && !exists(dir) { _ = try System.syscall("rename \(tmp)") { rename(tmp, dir) } }
            return
        }
        if exists(tmp) { try removeTree(tmp) }

        // The old queue, in order: runs of one stream, switch and batch.
        struct Old {
            var stream: String
            var consent: String
            var batch: String?
            var enqueuedMs: Int64
            var chunk = Chunk()
        }
        var olds: [Old] = []
        if hasChunks {
            let hasBodies = try table("chunk_bodies")
            if hasBodies {
                let s = try db.prepare(
                    "SELECT c.stream, c.consent, c.batch, c.enqueued_ms, b.body, b.idx FROM chunks c JOIN chunk_bodies b USING(seq) ORDER BY c.first"
                )
                while try s.step() {
                    let chunk = Chunk(body: s.withBlob(4) { Array($0) }, index: s.withBlob(5) { Array($0) })
                    guard !chunk.isEmpty else { continue }
                    olds.append(Old(stream: s.text(0), consent: s.text(1), batch: s.value(2).text, enqueuedMs: s.int(3), chunk: chunk))
                }
                s.reset()
            }
        }
        if hasRecords {
            var escaped: [UInt8] = []
            let rows = try db.prepare("SELECT stream, consent, id, ts, body, batch, enqueued_ms FROM records ORDER BY seq")
            while try rows.step() {
                let stream = rows.text(0), consent = rows.text(1), batch = rows.value(5).text
                if let last = olds.last, last.stream == stream, last.consent == consent, last.batch == batch,
                    last.chunk.count < migrationChunkRecords
                {
                } else {
                    olds.append(Old(stream: stream, consent: consent, batch: batch, enqueuedMs: rows.int(6)))
                }
                escaped.removeAll(keepingCapacity: true)
                rows.withText(2) { JSONText.appendString($0, to: &escaped) }
                let ts = rows.int(3)
                escaped.withUnsafeBytes { id in
                    rows.withText(4) { d in _ = olds[olds.count - 1].chunk.append(escapedID: id, ts: ts, data: d) }
                }
            }
            rows.reset()
        }
        var pending: [(key: String, final: Bool, createdMs: Int64)] = []
        if try table("batches") {
            for r in try db.query("SELECT key, final, created_ms FROM batches ORDER BY rowid") {
                pending.append((r[0].text ?? "", r[1].int == 1, r[2].int ?? 0))
            }
        }

        // 1. The segments.
        let log = try SegmentLog(dir: tmp, maxSegmentBytes: segmentBytes, fsyncEveryAppend: false)
        var lanes: [String: UInt64] = [:]
        var lanesOf: UInt32 = 0
        var position: Int64 = 0
        var byStream: [String: [(pos: Int64, batch: String?)]] = [:]
        for o in olds {
            var out: [UInt8] = []
            if log.needsNewSegment(for: o.chunk.body.count + 6 * o.chunk.count + 64) { try log.startSegment() }
            if lanesOf != log.active {
                lanes.removeAll()
                lanesOf = log.active
            }
            let lk = o.stream + "\u{0}" + o.consent
            let lane: UInt64
            if let l = lanes[lk] {
                lane = l
            } else {
                lane = UInt64(lanes.count)
                lanes[lk] = lane
                Frame.appendLane(&out, id: lane, stream: o.stream, consent: o.consent)
            }
            let positions = (0..<Int64(o.chunk.count)).map { position + $0 }
            position += Int64(o.chunk.count)
            _ = Frame.appendRecords(&out, lane: lane, positions: positions, enqueuedMs: o.enqueuedMs, chunk: o.chunk)
            try log.append(out)
            for p in positions { byStream[o.stream, default: []].append((p, o.batch)) }
        }
        var cuts: [UInt8] = []
        for (seq, b) in pending.enumerated() {
            guard let stream = olds.first(where: { $0.batch == b.key })?.stream else { continue }
            var runs: [ClosedRange<Int64>] = []
            var start: Int64?
            var end: Int64 = 0
            for r in byStream[stream] ?? [] {
                if r.batch == b.key {
                    if start == nil { start = r.pos }
                    end = r.pos
                } else if let s = start {
                    runs.append(s...end)
                    start = nil
                }
            }
            if let s = start { runs.append(s...end) }
            Frame.appendCut(&cuts, key: b.key, stream: stream, final: b.final, seq: UInt64(seq), createdMs: b.createdMs, runs: runs)
        }
        if !cuts.isEmpty {
            if log.needsNewSegment(for: cuts.count) { try log.startSegment() }
            try log.append(cuts)
        }
        if log.active != 0 { try log.sync(log.active) }
        try log.syncDirectory()
        log.close()

        // 2. The old tables go, their pages zeroed.
        try db.exec("PRAGMA secure_delete=ON")
        try db.transaction { () throws(SQLiteError) in
            for t in ["records", "chunk_bodies", "chunks", "batches"] { try db.exec("DROP TABLE IF EXISTS \(t)") }
            try db.exec("PRAGMA user_version=\(UploaderStore.format)")
        }
        try db.exec("PRAGMA wal_checkpoint(TRUNCATE)")

        // 3. In place.
        if exists(dir) { try removeTree(dir) }
        _ = try System.syscall("rename \(tmp)") { rename(tmp, dir) }
        let parent = String(dir[..<(dir.lastIndex(of: "/") ?? dir.startIndex)])
        try SegmentLog.syncDirectory(parent.isEmpty ? "." : parent)
    }

    /// Removes a directory of segment files (nothing else is ever in it).
    static func removeTree(_ dir: String) throws {
        guard let d = opendir(dir) else { return }
        var names: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != "." && name != ".." { names.append(name) }
        }
        closedir(d)
        for n in names { _ = unlink(dir + "/" + n) }
        _ = try System.syscall("rmdir \(dir)") { rmdir(dir) }
    }
}
