/// The uploader's queue in memory (docs/UPLOADER.md "In memory"): per stream its live records
/// in position order (where each one's text is, its state), the batches of the ledger, the ids
/// that make an enqueue a duplicate, and what each segment still holds. A pure value: it is
/// rebuilt from the segments' frames (`Replay`), changed by what `UploaderStore` wrote, and
/// answers the queue's decisions (which records a batch takes, whether a segment is removed or
/// copied forward); it never touches a file. Tested without a directory (QueueIndexTests).
struct QueueIndex {
    typealias BatchID = Int32

    /// Where a record is in its life: waiting for a batch, in batch `id`, or gone (delivered,
    /// purged or set aside; its entry is dropped lazily).
    enum RecordState: Equatable {
        case queued
        case batched(BatchID)
        case gone
    }

    /// Where a record's text is: in a records frame (`Rec.text` is a file offset), or in a
    /// packed frame (`Rec.text` is its offset in the frame's inflated texts) whose deflate
    /// context starts `context` bytes before the frame; `share` is the record's share of that
    /// frame's bytes in the file (`Rec.fileBytes`).
    enum Placement: Equatable {
        case plain
        case packed(context: UInt32, share: Int32)
    }

    /// A live record: its position, where its text is, and its state. 72 bytes (the fields in
    /// this order; offsets in a segment are `UInt32`, `SegmentLog.maxSegmentFileBytes`).
    struct Rec {
        var pos: Int64
        var enqueuedMs: Int64
        var key: RecordKey
        var seg: UInt32
        /// File offsets of its frame and (`Placement`) its text.
        var frameOffset: UInt32
        var textOffset: UInt32
        var len: Int32
        var consent: Int32
        var state: RecordState = .queued
        var place: Placement = .plain

        init(
            pos: Int64, seg: UInt32, frame: Int, text: Int, len: Int32, consent: Int32, place: Placement = .plain,
            enqueuedMs: Int64, key: RecordKey
        ) {
            self.pos = pos
            self.enqueuedMs = enqueuedMs
            self.key = key
            self.seg = seg
            frameOffset = UInt32(frame)
            textOffset = UInt32(text)
            self.len = len
            self.consent = consent
            self.place = place
        }

        var frame: Int { Int(frameOffset) }
        var text: Int { Int(textOffset) }
        var gone: Bool { state == .gone }
        var queued: Bool { state == .queued }
        var charge: Int { Chunk.charge(textBytes: Int(len)) }
        var packed: Bool { place != .plain }
        /// The offset of its deflate context's first frame (a packed record).
        var contextStart: Int {
            guard case .packed(let context, _) = place else { return frame }
            return frame - Int(context)
        }
        /// What it takes of its segment (`SegmentUse.bytes`, for the reclaim): its charge, or
        /// its share of its packed frame.
        var fileBytes: Int {
            guard case .packed(_, let share) = place else { return charge }
            return Int(share)
        }

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

        /// The records in `runs` (closed ranges of positions) in `state`, in position order.
        func positions(in runs: [ClosedRange<Int64>], state: RecordState) -> [Int64] {
            var out: [Int64] = []
            for run in runs {
                var i = lowerBound(run.lowerBound)
                while i < recs.count, recs[i].pos <= run.upperBound {
                    if recs[i].state == state { out.append(recs[i].pos) }
                    i += 1
                }
            }
            return out
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

    /// What each segment still holds: live records (and the bytes they take of it: their
    /// charges, or their shares of packed frames) and cut frames of live batches.
    struct SegmentUse: Equatable {
        var recs = 0
        var bytes = 0
        var cuts = 0
    }

    /// A record appended: its stream, position, and where its text went (the segment is the
    /// caller's).
    struct Placed {
        var stream: String
        var consent: Int32
        var pos: Int64
        var frame: Int
        var text: Int
        var len: Int32
        var key: RecordKey
        var enqueuedMs: Int64
        var place: Placement = .plain
    }

    /// Ids of the records on disk, per stream: an enqueue of an id already queued is a duplicate.
    var ids: [String: Set<RecordKey>] = [:]
    /// Ids delivered lately, per stream (`DeliveredIds`): a duplicate too.
    var delivered: [String: DeliveredIds] = [:]
    /// Queue position of the next record.
    var nextPosition: Int64 = 0
    /// The `seq` of the next cut frame.
    var nextCutSeq: UInt64 = 0
    private(set) var queues: [String: Queue] = [:]
    private(set) var batches: [BatchID: Batch] = [:]
    private(set) var batchIDs: [String: BatchID] = [:]
    private var nextBatchID: BatchID = 0
    /// Consent switch names by id (a record keeps the id).
    private(set) var consents: [String] = []
    private var consentIDs: [String: Int32] = [:]
    private(set) var segmentUse: [UInt32: SegmentUse] = [:]

    // MARK: Changes

    mutating func consentID(_ name: String) -> Int32 {
        if let id = consentIDs[name] { return id }
        let id = Int32(consents.count)
        consents.append(name)
        consentIDs[name] = id
        return id
    }

    /// The id of consent switch `name`, when a record was ever stored under it.
    func knownConsent(_ name: String) -> Int32? { consentIDs[name] }

    /// Batch `b` joins the ledger: its records (`positions`) are in it. `countCut`: its cut frame
    /// counts in `segmentUse` now (the replay counts every segment afresh at its end).
    mutating func addBatch(_ b: Batch, countCut: Bool = true) {
        let id = nextBatchID
        nextBatchID += 1
        batchIDs[b.key] = id
        batches[id] = b
        if countCut { segmentUse[b.cutSeg, default: SegmentUse()].cuts += 1 }
        guard var q = queues.removeValue(forKey: b.stream) else { return }
        for p in b.positions { if let i = q.index(of: p) { q.recs[i].state = .batched(id) } }
        queues[b.stream] = q
    }

    /// Batch `key` leaves the ledger: its records gone (delivered, purged, set aside) or queued
    /// again. Returns the keys of the records gone.
    @discardableResult
    mutating func removeBatch(_ key: String, recordsGone: Bool) -> [RecordKey] {
        guard let id = batchIDs.removeValue(forKey: key), let b = batches.removeValue(forKey: id) else { return [] }
        if var use = segmentUse[b.cutSeg] {
            use.cuts -= 1
            segmentUse[b.cutSeg] = use
        }
        guard var q = queues.removeValue(forKey: b.stream) else { return [] }
        var gone: [RecordKey] = []
        for p in b.positions {
            guard let i = q.index(of: p), q.recs[i].state == .batched(id) else { continue }
            if recordsGone {
                let r = q.recs[i]
                gone.append(r.key)
                q.recs[i].state = .gone
                q.goneCount += 1
                var use = segmentUse[r.seg] ?? SegmentUse()
                use.recs -= 1
                use.bytes -= r.fileBytes
                segmentUse[r.seg] = use
            } else {
                q.recs[i].state = .queued
            }
        }
        q.compactIfSparse()
        if q.recs.count > q.goneCount { queues[b.stream] = q }
        return gone
    }

    /// Marks batches `keys` final.
    mutating func markFinal(_ keys: [String]) {
        for k in keys { if let id = batchIDs[k] { batches[id]?.final = true } }
    }

    /// Puts records appended to segment `seg` in their streams' queues (new positions: at the
    /// ends).
    mutating func insert(_ placed: [Placed], seg: UInt32) {
        var i = 0
        while i < placed.count {
            let stream = placed[i].stream
            var q = queues.removeValue(forKey: stream) ?? Queue()
            while i < placed.count, placed[i].stream == stream {
                let p = placed[i]
                let rec = Rec(
                    pos: p.pos, seg: seg, frame: p.frame, text: p.text, len: p.len, consent: p.consent, place: p.place,
                    enqueuedMs: p.enqueuedMs, key: p.key)
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

    /// Records copied forward to segment `seg` (`placed`, at their positions): the queue points
    /// at the copies.
    mutating func moved(_ placed: [Placed], to seg: UInt32) {
        for p in placed {
            guard var q = queues.removeValue(forKey: p.stream) else { continue }
            if let i = q.index(of: p.pos) {
                let old = q.recs[i]
                q.recs[i].seg = seg
                q.recs[i].frameOffset = UInt32(p.frame)
                q.recs[i].textOffset = UInt32(p.text)
                q.recs[i].place = p.place
                var use = segmentUse[old.seg] ?? SegmentUse()
                use.recs -= 1
                use.bytes -= old.fileBytes
                segmentUse[old.seg] = use
                segmentUse[seg, default: SegmentUse()].recs += 1
                segmentUse[seg, default: SegmentUse()].bytes += q.recs[i].fileBytes
            }
            queues[p.stream] = q
        }
    }

    /// The cut frames of segment `from` were copied to segment `to`.
    mutating func movedCuts(from: UInt32, to: UInt32) {
        for (id, b) in batches where b.cutSeg == from {
            batches[id]!.cutSeg = to
            segmentUse[to, default: SegmentUse()].cuts += 1
        }
        segmentUse[from] = SegmentUse()
    }

    /// Segment `seg` was removed.
    mutating func removed(_ seg: UInt32) { segmentUse[seg] = nil }

    /// Records of `stream` left the disk: their ids may be enqueued again.
    mutating func forget(_ gone: [RecordKey], of stream: String) {
        guard var set = ids.removeValue(forKey: stream) else { return }
        for k in gone { set.remove(k) }
        if !set.isEmpty { ids[stream] = set }
    }

    // MARK: The replay's changes (`Replay`)

    /// A record read back from a segment, appended to its stream's queue (sorted afterwards).
    mutating func appendReplayed(_ rec: Rec, to stream: String) { queues[stream, default: Queue()].recs.append(rec) }

    mutating func sortQueues() {
        for name in Array(queues.keys) { queues[name]!.recs.sort { $0.pos < $1.pos } }
    }

    /// The queued records of `stream` in `runs` are gone (a batch ended whose cut frame went with
    /// an older segment).
    mutating func endQueued(stream: String, runs: [ClosedRange<Int64>]) {
        guard var q = queues.removeValue(forKey: stream) else { return }
        for run in runs {
            var i = q.lowerBound(run.lowerBound)
            while i < q.recs.count, q.recs[i].pos <= run.upperBound {
                if q.recs[i].queued { q.recs[i].state = .gone }
                i += 1
            }
        }
        queues[stream] = q
    }

    /// Drops the gone records, counts `segmentUse` afresh (applying the ledger decremented
    /// counts nothing had made) and fills the duplicate check.
    mutating func settle() {
        for (name, var q) in queues {
            q.recs.removeAll { $0.gone }
            q.goneCount = 0
            queues[name] = q
        }
        segmentUse = countedUse()
        for (name, q) in queues {
            let set = Set(q.recs.map(\.key))
            if !set.isEmpty { ids[name] = set }
        }
    }

    // MARK: Decisions

    /// The batch to cut from `stream`: the oldest queued records (of consent switch `only`, or
    /// of the oldest record's switch), at most `maxCount` and `maxBytes` (at least one), as
    /// positions and runs, and their bytes; nil when nothing is queued.
    func selectBatch(stream: String, maxCount: Int, maxBytes: Int, only: Int32?) -> (
        positions: [Int64], runs: [ClosedRange<Int64>], bytes: Int
    )? {
        guard let q = queues[stream] else { return nil }
        var switchID = only
        var positions: [Int64] = []
        var runs: [ClosedRange<Int64>] = []
        var runStart: Int64?
        var runEnd: Int64 = 0
        var bytes = 0
        for r in q.recs where !r.gone {
            let take: Bool
            if !r.queued {
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
        return positions.isEmpty ? nil : (positions, runs, bytes)
    }

    /// What the reclaim does next with the segments (`sizes`: number → bytes; `active`: the one
    /// appended to).
    enum ReclaimStep: Equatable {
        /// Nothing more.
        case done
        /// The active segment, past a quarter of its size with nothing live in it and the only
        /// one: closed (a new one started), so it goes too.
        case closeActive
        /// The oldest segment holds nothing live: removed.
        case remove(UInt32)
        /// The oldest segment is mostly dead (its live records take less than
        /// 1/`compactLiveFraction` of it), or the files hold more than twice the live records
        /// plus two segments: its live records and cut frames are copied forward.
        case copyForward(UInt32)
    }

    /// Only the oldest segment goes: a `done` frame is never removed while the records it ended
    /// are on disk.
    func nextReclaim(sizes: [UInt32: Int], active: UInt32, maxSegmentBytes: Int, compactLiveFraction: Int) -> ReclaimStep {
        guard let head = sizes.keys.min() else { return .done }
        let use = segmentUse[head] ?? SegmentUse()
        let dead = use.recs <= 0 && use.cuts <= 0
        if head == active {
            guard dead, sizes.count == 1, (sizes[head] ?? 0) > maxSegmentBytes / 4 else { return .done }
            return .closeActive
        }
        if dead { return .remove(head) }
        let live = segmentUse.values.reduce(0) { $0 + $1.bytes }
        let fileBytes = sizes.values.reduce(0, +)
        let pressed = fileBytes > 2 * live + 2 * maxSegmentBytes
        guard pressed || use.bytes * compactLiveFraction < (sizes[head] ?? 0) else { return .done }
        return .copyForward(head)
    }

    // MARK: Queries

    /// The live records of batch `key`, in position order.
    func records(ofBatch key: String) -> [Rec] {
        guard let id = batchIDs[key], let b = batches[id], let q = queues[b.stream] else { return [] }
        return b.positions.compactMap { p in q.index(of: p).flatMap { q.recs[$0].state == .batched(id) ? q.recs[$0] : nil } }
    }

    func batch(_ key: String) -> Batch? { batchIDs[key].flatMap { batches[$0] } }

    /// What an `ended` frame says of batches `keys`: each with its stream and runs.
    func ended(_ keys: [String]) -> [Frame.Ended] {
        keys.compactMap { k in batch(k).map { Frame.Ended(key: k, stream: $0.stream, runs: $0.runs) } }
    }

    /// The keys of the records of the batches `keys`, per stream (delivered batches leaving
    /// the duplicate check).
    func recordKeys(ofBatches keys: [String]) -> [(stream: String, keys: [RecordKey])] {
        keys.compactMap { key in
            guard let b = batch(key), let q = queues[b.stream] else { return nil }
            return (b.stream, b.positions.compactMap { p in q.index(of: p).map { q.recs[$0].key } })
        }
    }

    /// Whether a live record has its text at `text` of segment `seg`.
    func isLive(pos: Int64, seg: UInt32, text: Int) -> Bool {
        for (_, q) in queues {
            if let i = q.index(of: pos), !q.recs[i].gone, q.recs[i].seg == seg, q.recs[i].text == text { return true }
        }
        return false
    }

    /// The batches not yet final holding records under consent switch `consent`.
    func unfinalBatches(consent: String) -> [String] {
        guard let c = consentIDs[consent] else { return [] }
        return batches.values.filter { b in !b.final && records(ofBatch: b.key).contains { $0.consent == c } }.map(\.key)
    }

    /// The consent switches records are stored under.
    func consentKeys() -> [String] {
        var used = Set<Int32>()
        for q in queues.values { for r in q.recs where !r.gone { used.insert(r.consent) } }
        return used.map { consents[Int($0)] }
    }

    /// Streams with queued records under `consent`.
    func streams(withConsent consent: String) -> [String] {
        guard let c = consentIDs[consent] else { return [] }
        return queues.compactMap { name, q in q.recs.contains { $0.queued && $0.consent == c } ? name : nil }
    }

    struct StreamSummary {
        var queued = 0
        var queuedBytes = 0
        var oldestMs: Int64?
        var pendingBatches: [String] = []
    }

    /// What is on disk per stream (at start-up, and for status).
    func summaries() -> [String: StreamSummary] {
        var out: [String: StreamSummary] = [:]
        for (name, q) in queues {
            var s = StreamSummary()
            for r in q.recs where r.queued {
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
    func streamBytes() -> [String: Int] {
        var out: [String: Int] = [:]
        for (name, q) in queues {
            let n = q.recs.reduce(0) { $0 + ($1.gone ? 0 : $1.charge) }
            if n > 0 { out[name] = n }
        }
        return out
    }

    /// `segmentUse` counted from scratch.
    func countedUse() -> [UInt32: SegmentUse] {
        var want: [UInt32: SegmentUse] = [:]
        for q in queues.values {
            for r in q.recs where !r.gone {
                want[r.seg, default: SegmentUse()].recs += 1
                want[r.seg, default: SegmentUse()].bytes += r.fileBytes
            }
        }
        for b in batches.values { want[b.cutSeg, default: SegmentUse()].cuts += 1 }
        return want
    }

    /// Where `segmentUse` differs from `countedUse`, and live segments not among `segments`
    /// (tests, the segment fuzzer).
    func segmentUseErrors(segments: Set<UInt32>) -> [String] {
        let want = countedUse()
        var out: [String] = []
        for seg in Set(want.keys).union(segmentUse.keys) {
            let w = want[seg] ?? SegmentUse(), h = segmentUse[seg] ?? SegmentUse()
            if w != h { out.append("segment \(seg): counted \(h), is \(w)") }
            if w.recs + w.cuts > 0 && !segments.contains(seg) { out.append("segment \(seg) removed while live") }
        }
        return out
    }
}
