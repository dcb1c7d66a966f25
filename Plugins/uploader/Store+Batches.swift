import PylonCore
import PylonStore

/// Batches: cut from the index's queued records, read back (texts, bodies), and ended
/// (delivered, purged, dissolved, made final). Each change is its frame appended first, then the
/// index changed.
extension UploaderStore {
    // MARK: Batches

    /// Assigns the oldest queued records of `stream` (same consent switch, at most `maxCount`
    /// and `maxBytes`, at least one) to a new batch `key`, whose cut frame is written before
    /// anything is sent. Returns the number of records in it and their bytes (0 when nothing
    /// was queued).
    func cutBatch(
        stream: String, key: String, maxCount: Int, maxBytes: Int, final: Bool, consent: String? = nil,
        nowMs: Int64
    ) throws -> (count: Int, bytes: Int) {
        let only = consent.flatMap { index.knownConsent($0) }
        if consent != nil, only == nil { return (0, 0) }
        guard let pick = index.selectBatch(stream: stream, maxCount: maxCount, maxBytes: maxBytes, only: only) else { return (0, 0) }
        var out: [UInt8] = []
        let seq = index.nextCutSeq
        Frame.appendCut(&out, key: key, stream: stream, final: final, seq: seq, createdMs: nowMs, runs: pick.runs)
        try prepareSegment(for: out.count)
        try log.append(out)
        index.nextCutSeq += 1
        index.addBatch(
            .init(
                key: key, stream: stream, final: final, seq: seq, createdMs: nowMs, runs: pick.runs, positions: pick.positions,
                cutSeg: log.active))
        return (pick.positions.count, pick.bytes)
    }

    /// The live records of batch `key`, in position order.
    func records(ofBatch key: String) -> [Rec] { index.records(ofBatch: key) }

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

    func plainTexts(_ recs: ArraySlice<Rec>, _ each: (UnsafeRawBufferPointer) -> Void) throws {
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

    /// The inflated texts of the packed frames at `frames` of context `c`: its frames are read
    /// with one pread, from its first (or where the last read of it stopped, when that is
    /// before all of `frames`) to the last of `frames`, and inflated in order.
    func inflateContext(_ c: Context, frames: Set<Int>) throws -> [Int: [UInt8]] {
        guard let firstNeeded = frames.min(), let last = frames.max() else { return [:] }
        var from = c.start
        var lane: UInt64?
        var seq: UInt64 = 0
        let inflater: Inflater
        if let k = readCursor, k.c == c, k.next <= firstNeeded {
            (from, lane, seq, inflater) = (k.next, k.lane, k.seq, k.inflater)
        } else {
            inflater = try LaneDeflate.inflater()
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
                guard s == seq, FrameFile.crc32(body) == Chunk.u32(b, at + 4) else { throw broken }
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

    func isFinal(_ key: String) throws -> Bool { index.batch(key)?.final ?? false }

    /// Delivered (or a final batch that is purged whatever happened): the records are gone, and
    /// their ids may be enqueued again. `zero`: their texts are overwritten with zeros in the
    /// segment files and fdatasynced (records purged because consent was denied, or set aside).
    func deleteBatch(_ key: String, zero: Bool = false) throws {
        guard let stream = index.batch(key)?.stream else { return }
        let recs = zero ? records(ofBatch: key) : []
        var out: [UInt8] = []
        Frame.appendEnded(&out, index.ended([key]), zeroed: zero)
        try prepareSegment(for: out.count)
        try log.append(out, sync: zero)
        let gone = index.removeBatch(key, recordsGone: true)
        index.forget(gone, of: stream)
        if zero { try zeroTexts(recs) }
        try reclaim()
    }

    /// Batch `key` was delivered: its `done` frame joins the next group commit's write
    /// (`commit`), or `applyDeliveredDeletes` when none comes. Until then the batch is on disk:
    /// its ids are still duplicates, and a crash before it makes the batch go again after the
    /// restart (the backend keeps it once, by its key).
    func deleteDelivered(_ key: String) { deliveredQueue.append(key) }

    /// Writes the `done` frame of the delivered batches waiting, on its own.
    func applyDeliveredDeletes() throws {
        guard !deliveredQueue.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendEnded(&out, index.ended(deliveredQueue), zeroed: false)
        try prepareSegment(for: out.count)
        try log.append(out)
        for key in deliveredQueue {
            guard let stream = index.batch(key)?.stream else { continue }
            let keys = index.removeBatch(key, recordsGone: true)
            index.forget(keys, of: stream)
            index.delivered[stream, default: DeliveredIds()].add(keys)
        }
        deliveredQueue.removeAll()
        try reclaim()
    }

    /// Dissolves batches, with one frame, so their records are cut again (after a 413): they
    /// are queued again at their places.
    func unbatch(_ keys: [String]) throws {
        let known = keys.filter { index.batch($0) != nil }
        guard !known.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendKeys(&out, .unbatch, known)
        try prepareSegment(for: out.count)
        try log.append(out)
        for k in known { index.removeBatch(k, recordsGone: false) }
        try reclaim()
    }

    private func markFinal(_ keys: [String]) throws {
        guard !keys.isEmpty else { return }
        var out: [UInt8] = []
        Frame.appendKeys(&out, .final, keys)
        try prepareSegment(for: out.count)
        try log.append(out)
        index.markFinal(keys)
    }

    /// Marks every pending batch holding records under `consent` final (sent once, no retry).
    func markFinal(consent: String) throws { try markFinal(index.unfinalBatches(consent: consent)) }

    /// Marks every pending batch of `stream` final.
    func markFinal(stream: String) throws {
        try markFinal(index.batches.values.filter { $0.stream == stream && !$0.final }.map(\.key))
    }

    /// The consent switches records are stored under.
    func consentKeys() throws -> [String] { index.consentKeys() }

    /// Streams with queued records under `consent`.
    func streams(withConsent consent: String) throws -> [String] { index.streams(withConsent: consent) }

    /// What is on disk per stream (at start-up, and for status).
    func summaries() throws -> [String: StreamSummary] { index.summaries() }

    /// Bytes of records on disk per stream (queued or in a batch).
    func streamBytes() throws -> [String: Int] { index.streamBytes() }

    func totalBytes() throws -> Int { try streamBytes().values.reduce(0, +) }
}
