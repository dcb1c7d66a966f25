import CZlib
import Glibc
import PylonCore
import PylonPluginKit
import PylonStore
import TestSupport
import Testing

@testable import pylon_uploader

/// The append-only queue (format 4): frames, replay at open (torn tails, damaged frames),
/// bytes written per record, segments removed and copied forward, and the migration of a
/// format-3 queue written with that release's SQL.
struct SegmentQueueTests {
    typealias T = StoreTests

    static func ids(_ store: UploaderStore, _ key: String, _ stream: String = "s") throws -> [String] {
        try T.records(store.batchBody(key, stream: stream).body).records.map(\.id)
    }

    /// A JSON string of `n` random letters and digits: what deflate cannot shrink much, so
    /// segments fill at about the rate they would uncompressed.
    static func noise(_ n: Int, _ rng: inout SplitMix64) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        return "\"" + String((0..<n).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] }) + "\""
    }

    // MARK: Frames

    @Test func framesReadBackAsWritten() throws {
        var out = Frame.segmentMagic
        Frame.appendLane(&out, id: 3, stream: "ma.app", consent: "analytics")
        var chunk = Chunk()
        for (id, data) in [("\"a\"", "1"), ("\"b\"", #"{"x":[1,2]}"#)] {
            Array(id.utf8).withUnsafeBytes { i in Array(data.utf8).withUnsafeBytes { d in _ = chunk.append(escapedID: i, ts: 9, data: d) } }
        }
        let starts = Frame.appendRecords(&out, lane: 3, positions: [10, 12], enqueuedMs: 77, chunk: chunk)
        Frame.appendCut(&out, key: "k", stream: "ma.app", final: true, seq: 5, createdMs: 8, runs: [10...12, 20...20])
        Frame.appendKeys(&out, .final, ["k"])
        Frame.appendKeys(&out, .done, ["k", "j"], zeroed: true)
        Frame.appendKeys(&out, .unbatch, ["u"])
        Frame.appendEnded(&out, [.init(key: "e", stream: "s", runs: [1...3])], zeroed: false)
        let (found, end) = out.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count) }
        #expect(end == out.count && found.allSatisfy { $0.crcOK })
        let lengths = chunk.index.withUnsafeBytes { ix in (0..<2).map { Chunk.span(ix, $0).count } }
        #expect(
            found.map(\.frame) == [
                .lane(id: 3, stream: "ma.app", consent: "analytics"),
                .records(lane: 3, first: 10, enqueuedMs: 77, deltas: [2], lengths: lengths, textStart: starts[0]),
                .cut(key: "k", stream: "ma.app", final: true, seq: 5, createdMs: 8, runs: [10...12, 20...20]),
                .final(["k"]), .done(keys: ["k", "j"], zeroed: true), .unbatch(["u"]),
                .ended([.init(key: "e", stream: "s", runs: [1...3])], zeroed: false),
            ])
        #expect(String(decoding: out[starts[1]..<(starts[1] + lengths[1])], as: UTF8.self) == #"{"id":"b","ts":9,"data":{"x":[1,2]}}"#)
        // A torn tail (the last frame cut short, or its bytes never written) ends the valid part.
        for cut in [1, 5, 12] {
            let torn = Array(out.dropLast(cut))
            let r = torn.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count) }
            #expect(r.frames.count == 6 && r.validEnd == found[6].offset)
        }
        var zeroed = out
        for i in found[6].offset..<out.count { zeroed[i] = 0 }
        #expect(zeroed.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count) }.validEnd == found[6].offset)
    }

    /// A packed frame decodes with its head as written; its texts inflate, in order, after the
    /// frames of its context before it, and not without them; a zeroed payload does not
    /// inflate.
    @Test func packedFramesInflateInTheirContextOnly() throws {
        var out = Frame.segmentMagic
        Frame.appendLane(&out, id: 1, stream: "s", consent: "s")
        let deflater = try LaneDeflate.deflater()
        var chunks: [Chunk] = []
        for (k, texts) in [
            [("\"a\"", #"{"event":"purchase","sku":"A-1"}"#), ("\"b\"", "2")], [("\"c\"", #"{"event":"purchase","sku":"A-1"}"#)],
        ]
        .enumerated() {
            var chunk = Chunk()
            for (id, data) in texts {
                Array(id.utf8).withUnsafeBytes { i in
                    Array(data.utf8).withUnsafeBytes { d in _ = chunk.append(escapedID: i, ts: 9, data: d) }
                }
            }
            try Frame.appendPacked(
                &out, lane: 1, positions: (0..<Int64(chunk.count)).map { Int64(10 * k) + $0 }, enqueuedMs: 5, chunk: chunk, seq: UInt64(k),
                stream: deflater)
            chunks.append(chunk)
        }
        let (found, end) = out.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count) }
        #expect(end == out.count && found.count == 3 && found.allSatisfy { $0.crcOK })
        func payload(_ f: Frame.Found) -> (Range<Int>, Int)? {
            guard case .packed(_, _, _, _, let lengths, _, let dataStart)? = f.frame else { return nil }
            return (dataStart..<(f.offset + f.length), Frame.textBytes(lengths))
        }
        guard case .packed(1, 0, 5, [1], let lengths, 0, _)? = found[1].frame, let p1 = payload(found[1]), let p2 = payload(found[2]),
            case .packed(1, 10, 5, [], _, 1, _)? = found[2].frame
        else {
            Issue.record("not the packed frames written: \(found.map(\.frame))")
            return
        }
        #expect(lengths == chunks[0].index.withUnsafeBytes { ix in (0..<2).map { Chunk.span(ix, $0).count } })
        let inflater = try LaneDeflate.inflater()
        let t1 = out.withUnsafeBytes { inflater.inflate(UnsafeRawBufferPointer(rebasing: $0[p1.0]), expected: p1.1) }
        let t2 = out.withUnsafeBytes { inflater.inflate(UnsafeRawBufferPointer(rebasing: $0[p2.0]), expected: p2.1) }
        #expect(t1 == chunks[0].body && t2 == chunks[1].body)
        #expect(p2.0.count < chunks[1].body.count / 2, "the second frame's text is mostly back-references")
        // Without the frame before it, the second does not inflate to its text.
        let alone = try LaneDeflate.inflater()
        #expect(out.withUnsafeBytes { alone.inflate(UnsafeRawBufferPointer(rebasing: $0[p2.0]), expected: p2.1) } != chunks[1].body)
        var zeroed = out
        for i in p1.0 { zeroed[i] = 0 }
        let fresh = try LaneDeflate.inflater()
        #expect(zeroed.withUnsafeBytes { fresh.inflate(UnsafeRawBufferPointer(rebasing: $0[p1.0]), expected: p1.1) } == nil)
    }

    /// `queueCompression`: `deflate` by default, `none` on request, anything else refused (the
    /// plugin exits 78 on a refused configuration) with a message naming the key.
    @Test func queueCompressionIsReadStrictly() throws {
        #expect(try UploaderConfig([:]).queueCompression == .deflate)
        #expect(try UploaderConfig(["queueCompression": "none"]).queueCompression == .none)
        #expect(try UploaderConfig(["queueCompression": "deflate"]).queueCompression == .deflate)
        for bad: JSON in ["gzip", "Deflate", 1, true, ["deflate"]] {
            #expect(throws: UploaderConfigError.self) { try UploaderConfig(["queueCompression": bad]) }
        }
        let error = #expect(throws: UploaderConfigError.self) { try UploaderConfig(["queueCompression": "zstd"]) }
        #expect(error?.description.contains("queueCompression must be \"deflate\" or \"none\"") == true, "\(String(describing: error))")
    }

    // MARK: What a record costs on disk

    /// One record per group commit (a device's rate): the segment grows by the record's upload
    /// form and a frame of less than 20 bytes around it (`none`), or by less than half of it
    /// (`deflate`: the lane's deflate stream has seen the record before), and by nothing else
    /// (no page, journal or index rewritten).
    @Test(arguments: [QueueCompression.none, .deflate]) func oneRecordPerCommitAppendsItsTextAndASmallFrame(
        compression: QueueCompression
    ) throws {
        let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: false, compression: compression)
        defer { store.close() }
        let data = #"{"appKey":"lowrate","eventName":"purchase","property":{"sku":"A-1","price":9.99}}"#
        try T.enqueue(store, "s", [("r0", data)])  // declares the lane
        for i in 1...50 {
            let before = store.log.fileBytes
            try T.enqueue(store, "s", [("r\(i)", data)], ts: 1_764_590_000_000)
            let text = #"{"id":"r\#(i)","ts":1764590000000,"data":"#.utf8.count + data.utf8.count + 1
            let grew = store.log.fileBytes - before
            if compression == .none {
                #expect(grew > text && grew <= text + 20, "record \(i): \(grew) bytes for a text of \(text)")
            } else {
                #expect(grew < text / 2, "record \(i): \(grew) bytes for a text of \(text)")
            }
        }
        // A cut and a delivery are one small frame each.
        let before = store.log.fileBytes
        _ = try store.cutBatch(stream: "s", key: "0123456789abcdef", maxCount: 50, maxBytes: 1 << 20, final: false, nowMs: 1)
        try store.deleteBatch("0123456789abcdef")
        #expect(store.log.fileBytes - before < 80)
    }

    /// What the device target rests on (issue 24): 200 near-identical records (one stream, the
    /// same keys and values but the id, ts and one number), one per group commit, grow the
    /// segments by under a third of their upload form with `deflate` (headers and cut frames
    /// included), where `none` stores more than all of it.
    @Test func nearIdenticalRecordsPackToAFractionOfTheirText() throws {
        var grew: [QueueCompression: Int] = [:]
        var texts = 0
        for compression in [QueueCompression.none, .deflate] {
            let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: false, compression: compression)
            defer { store.close() }
            let before = store.log.fileBytes
            texts = 0
            for i in 0..<200 {
                let data =
                    #"{"appKey":"lowrate","eventName":"purchase","property":{"sku":"A-1","price":\#(i % 7).99,"#
                    + #""session":"3f2a9c1e-7b4d-4e8a-9c21-5d6e7f8a9b0c"}}"#
                let ts = 1_764_590_000_000 + Int64(i) * 97
                try T.enqueue(store, "ma.lowrate", [("r\(i)", data)], ts: ts)
                texts += #"{"id":"r\#(i)","ts":\#(ts),"data":"#.utf8.count + data.utf8.count + 1
                if i % 50 == 49 {
                    _ = try store.cutBatch(stream: "ma.lowrate", key: "k\(i)", maxCount: 50, maxBytes: 1 << 20, final: false, nowMs: 1)
                }
            }
            grew[compression] = store.log.fileBytes - before
        }
        #expect(grew[.none]! > texts)
        #expect(grew[.deflate]! * 3 < texts, "\(grew[.deflate]!) bytes for \(texts) of texts")
    }

    /// What one lane's deflate stream costs, measured: zlib's allocations for a stream of the
    /// parameters `LaneDeflate` uses (counted through `zalloc`), within `LaneDeflate.memoryBytes`
    /// (the figure docs/UPLOADER.md gives) and not far below it.
    @Test func aDeflateStreamTakesWhatTheDocsSay() throws {
        let counter = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        counter.initialize(to: 0)
        defer { counter.deallocate() }
        let s = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
        s.initialize(to: z_stream())
        defer { s.deallocate() }
        s.pointee.opaque = UnsafeMutableRawPointer(counter)
        s.pointee.zalloc = { opaque, items, size in
            opaque!.assumingMemoryBound(to: Int.self).pointee += Int(items) * Int(size)
            return calloc(Int(items), Int(size))
        }
        s.pointee.zfree = { _, p in free(p) }
        let rc = deflateInit2_(
            s, LaneDeflate.level, Z_DEFLATED, -LaneDeflate.windowBits, LaneDeflate.memLevel, Z_DEFAULT_STRATEGY, zlibVersion(),
            Int32(MemoryLayout<z_stream>.size))
        #expect(rc == Z_OK)
        deflateEnd(s)
        #expect(counter.pointee + MemoryLayout<z_stream>.size <= LaneDeflate.memoryBytes, "\(counter.pointee) bytes")
        #expect(counter.pointee * 4 > LaneDeflate.memoryBytes * 3, "\(counter.pointee) bytes")
    }

    /// A live record costs 72 bytes in memory, packed or not (docs/UPLOADER.md "In memory").
    @Test func aRecordInMemoryStaysSmall() {
        #expect(MemoryLayout<UploaderStore.Rec>.stride == 72)
    }

    // MARK: Replay

    /// What was written survives without a clean close (a kill -9): records, batches with their
    /// keys, final marks, dissolved batches and deliveries are all as they were.
    @Test func theQueueIsReplayedAsItWasLeft() throws {
        let path = T.tempPath()
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            try T.enqueue(store, "s", T.numbered("r", 0..<10))
            try T.enqueue(store, "t", T.numbered("t", 0..<3))
            try T.enqueue(store, "s", consent: "other", [("o", "1")])
            _ = try store.cutBatch(stream: "s", key: "k1", maxCount: 3, maxBytes: 1 << 20, final: false, nowMs: 1)
            _ = try store.cutBatch(stream: "s", key: "k2", maxCount: 3, maxBytes: 1 << 20, final: false, nowMs: 1)
            _ = try store.cutBatch(stream: "s", key: "k3", maxCount: 2, maxBytes: 1 << 20, final: false, nowMs: 1)
            try store.deleteBatch("k1")
            try store.markFinal(stream: "s")
            try store.unbatch(["k3"])
            _ = try store.cutBatch(stream: "t", key: "t1", maxCount: 2, maxBytes: 1 << 20, final: false, nowMs: 1)
            // What a kill -9 leaves: the files closed, nothing flushed or written at shutdown.
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        let sums = try store.summaries()
        #expect(sums["s"]?.pendingBatches == ["k2"] && sums["t"]?.pendingBatches == ["t1"])
        #expect(sums["s"]?.queued == 5 && sums["t"]?.queued == 1)
        #expect(try store.isFinal("k2") && !store.isFinal("t1"))
        #expect(try Self.ids(store, "k2") == ["r3", "r4", "r5"])
        #expect(try Self.ids(store, "t1", "t") == ["t0", "t1"])
        #expect(try T.enqueue(store, "s", [("r0", "x"), ("r6", "x")]).added == 1, "r0 was delivered, r6 is queued")
        // A cut stops at the record of another switch.
        #expect(try store.cutBatch(stream: "s", key: "n", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 4)
        #expect(try Self.ids(store, "n") == ["r6", "r7", "r8", "r9"])
        #expect(try store.consentKeys().sorted() == ["other", "s", "t"])
    }

    /// A write cut short by a crash (the last frame incomplete, or its blocks never written) is
    /// cut off at the last whole frame; everything before it is replayed.
    @Test(arguments: [3, 40]) func aTornTailIsTruncatedAtTheLastWholeFrame(lost: Int) throws {
        let path = T.tempPath()
        var size = 0
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            try T.enqueue(store, "s", T.numbered("r", 0..<5))
            size = store.log.fileBytes
            try T.enqueue(store, "s", [("torn", #"{"v":"0123456789012345678901234567890123456789012345"}"#)])
            let n = store.log.active
            let full = store.log.sizes[n]!
            try store.log.truncate(n, to: full - lost)
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.log.fileBytes == size, "cut back to the last whole frame")
        #expect(try store.summaries()["s"]?.queued == 5)
        try T.enqueue(store, "s", [("after", "1")])
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        #expect(try Self.ids(store, "k") == ["r0", "r1", "r2", "r3", "r4", "after"])
    }

    /// A purge interrupted between its zeroing and its crc leaves a frame that fails its crc with
    /// valid frames after it: its live records are kept, the purged ones stay zeroed, and the
    /// frame is rewritten whole.
    ///
    /// Packed (`deflate`): the purge has copied the context's live records forward, then zeroed
    /// the payload of the context's first frame when the crash comes (its crc not rewritten, the
    /// frame after it untouched): the live records are read from their copies, nothing of the
    /// purged ones can be inflated, and every frame of the context is zeroed at the open.
    @Test(arguments: [QueueCompression.none, .deflate]) func anInterruptedPurgeKeepsTheFramesOtherRecords(
        compression: QueueCompression
    ) throws {
        let path = T.tempPath()
        let marker = "interrupted-purge-"
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false, compression: compression)
            try T.enqueue(store, "s", [("p0", #""\#(marker)0""#), ("p1", #""\#(marker)1""#), ("keep", "2")])
            try T.enqueue(store, "s", [("later", "3")])
            _ = try store.cutBatch(stream: "s", key: "f", maxCount: 2, maxBytes: 1 << 20, final: true, nowMs: 1)
            // What a purge does before its crc is rewritten: the done frame, then zeros.
            let recs = store.records(ofBatch: "f")
            var done: [UInt8] = []
            Frame.appendKeys(&done, .done, ["f"], zeroed: true)
            try store.log.append(done)
            if compression == .none {
                for r in recs { try store.log.overwrite(r.seg, at: r.text, [UInt8](repeating: 0, count: Int(r.len))) }
            } else {
                let contexts = try store.copyCompanionsForward(recs)
                #expect(contexts.count == 1)
                let c = contexts.first!
                let found = try store.log.read(c.seg).withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count).frames }
                guard let f = found.first(where: { $0.offset == c.start }), case .packed(_, _, _, _, _, 0, let dataStart)? = f.frame else {
                    Issue.record("no packed frame at \(c.start)")
                    return
                }
                try store.log.overwrite(c.seg, at: dataStart, [UInt8](repeating: 0, count: f.offset + f.length - dataStart))
            }
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false, compression: compression)
        defer { store.close() }
        #expect(store.damagedRecords == 0)
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        #expect(try Self.ids(store, "k") == ["keep", "later"])
        #expect(try !T.fileHolds(store, path, marker))
        store.close()
        // Rewritten: it passes its crc now.
        let again = try UploaderStore(path: path, fsyncEveryCommit: false, compression: compression)
        defer { again.close() }
        let all = try again.log.read(again.log.active).withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count).frames }
        #expect(all.allSatisfy { $0.crcOK })
    }

    /// A purge in a packed context (issue 24's zeroing rule): two batches and a queued record
    /// share one deflate context; purging one batch copies the others' records forward and
    /// zeroes the whole context. The other batch is delivered intact, also after a reopen, the
    /// queued record is still queued, and no text of the purged batch can be recovered from any
    /// file, by inflating any context there.
    @Test func aPurgeCopiesItsContextsOtherRecordsForwardAndZeroesTheContext() throws {
        let path = T.tempPath()
        let marker = "purged-in-context-"
        let kept = (0..<4).map { ("k\($0)", #"{"event":"purchase","n":\#($0)}"#) }
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            // One record per commit: four frames of one context, the purged batch in between.
            try T.enqueue(store, "s", [kept[0]])
            try T.enqueue(store, "s", [kept[1]])
            try T.enqueue(store, "s", [("p0", #"{"event":"\#(marker)0","n":9}"#)])
            try T.enqueue(store, "s", [("p1", #"{"event":"\#(marker)1","n":9}"#)])
            try T.enqueue(store, "s", [kept[2]])
            try T.enqueue(store, "s", [kept[3]])
            #expect(try store.cutBatch(stream: "s", key: "a", maxCount: 2, maxBytes: 1 << 20, final: false, nowMs: 1).count == 2)
            #expect(try store.cutBatch(stream: "s", key: "p", maxCount: 2, maxBytes: 1 << 20, final: true, nowMs: 1).count == 2)
            #expect(try store.cutBatch(stream: "s", key: "b", maxCount: 1, maxBytes: 1 << 20, final: false, nowMs: 1).count == 1)
            let before = Set(store.records(ofBatch: "a").map { Int($0.seg) << 32 | $0.contextStart })
            #expect(before == Set(store.records(ofBatch: "p").map { Int($0.seg) << 32 | $0.contextStart }), "one context")
            #expect(try T.fileHolds(store, path, marker), "readable before the purge")
            try store.deleteBatch("p", zero: true)
            #expect(try !T.fileHolds(store, path, marker))
            #expect(try Self.ids(store, "a") == ["k0", "k1"])
            #expect(store.segmentUseErrors().isEmpty)
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.damagedRecords == 0)
        #expect(try !T.fileHolds(store, path, marker))
        #expect(
            try T.records(store.batchBody("a", stream: "s").body).records.map { "\($0.id) \($0.data)" }
                == kept[0...1].map { "\($0.0) \($0.1)" })
        #expect(try Self.ids(store, "b") == ["k2"])
        #expect(try store.summaries()["s"]?.queued == 1)
        _ = try store.cutBatch(stream: "s", key: "c", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        #expect(try T.records(store.batchBody("c", stream: "s").body).records.map { "\($0.id) \($0.data)" } == ["k3 \(kept[3].1)"])
    }

    /// Purges across full contexts (each past `packContextBytes`, read in small windows):
    /// the purged batch's contexts are zeroed whole and only they; the records before and after
    /// them are delivered intact, also after a reopen.
    @Test func aPurgeAcrossFullContextsZeroesThemAndOnlyThem() throws {
        let path = T.tempPath()
        var rng = SplitMix64(seed: 24)
        let marker = "purged-large-"
        var all: [(String, String)] = []
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            for i in 0..<300 {
                let noise = Self.noise(2000, &rng)
                let data = i >= 120 && i < 150 ? "\"\(marker)\(i)-" + noise.dropFirst() : noise
                all.append(("r\(i)", data))
                try T.enqueue(store, "s", [all[i]])
            }
            // Windows smaller than a frame: every frame is read on its own.
            store.zeroReadWindow = 1000
            let before = try T.inflatedTexts(store).count
            for (k, n) in [("a", 120), ("p", 30), ("b", 150)] {
                #expect(try store.cutBatch(stream: "s", key: k, maxCount: n, maxBytes: 1 << 30, final: k == "p", nowMs: 1).count == n)
            }
            let contexts = Set(store.records(ofBatch: "p").map { $0.contextStart })
            #expect(contexts.count == 2, "batch p spans two contexts")
            try store.deleteBatch("p", zero: true)
            #expect(try !T.fileHolds(store, path, marker))
            // Frames of the two contexts are zeroed; the rest still inflate (and copies were added).
            #expect(try T.inflatedTexts(store).count < before)
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.damagedRecords == 0)
        #expect(try !T.fileHolds(store, path, marker))
        for (k, range) in [("a", 0..<120), ("b", 150..<300)] {
            let recs = try T.records(store.batchBody(k, stream: "s").body).records
            #expect(recs.map { "\($0.id) \($0.data)" } == all[range].map { "\($0.0) \($0.1)" })
        }
    }

    /// Many streams written in turn: at most `maxOpenPacks` deflate streams are open (the least
    /// recently written lane's context ends when another needs one), and every record reads back,
    /// before and after a reopen.
    @Test func manyLanesShareABoundedNumberOfDeflateStreams() throws {
        let path = T.tempPath()
        let streams = (0..<(UploaderStore.maxOpenPacks * 2 + 3)).map { "s\($0)" }
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            for round in 0..<4 {
                for s in streams { try T.enqueue(store, s, [("\(s)-\(round)", #"{"round":\#(round),"stream":"\#(s)"}"#)]) }
                #expect(store.openPacks <= UploaderStore.maxOpenPacks)
            }
            #expect(store.openPacks == UploaderStore.maxOpenPacks)
            for s in streams.prefix(5) {
                _ = try store.cutBatch(stream: s, key: "k\(s)", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
                #expect(try Self.ids(store, "k\(s)", s) == (0..<4).map { "\(s)-\($0)" })
            }
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(store.damagedRecords == 0)
        for s in streams {
            let key = "k\(s)"
            if try !store.summaries()[s, default: .init()].pendingBatches.contains(key) {
                _ = try store.cutBatch(stream: s, key: key, maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
            }
            let recs = try T.records(store.batchBody(key, stream: s).body).records
            #expect(recs.map(\.id) == (0..<4).map { "\(s)-\($0)" })
            #expect(recs.map(\.data) == (0..<4).map { #"{"round":\#($0),"stream":"\#(s)"}"# })
        }
    }

    /// The setting may change between starts: a queue written with one is read, extended and
    /// delivered with the other (both kinds of frame in one queue, even one segment).
    @Test(arguments: [(QueueCompression.deflate, QueueCompression.none), (.none, .deflate)])
    func aQueueWrittenWithOneSettingIsReadWithTheOther(first: QueueCompression, then: QueueCompression) throws {
        let path = T.tempPath()
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false, compression: first)
            try T.enqueue(store, "s", T.numbered("a", 0..<3))
            try T.enqueue(store, "s", T.numbered("b", 0..<2))
            store.close()
        }
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false, compression: then)
            try T.enqueue(store, "s", T.numbered("c", 0..<2))
            _ = try store.cutBatch(stream: "s", key: "k", maxCount: 4, maxBytes: 1 << 20, final: true, nowMs: 1)
            #expect(try Self.ids(store, "k") == ["a0", "a1", "a2", "b0"])
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false, compression: first)
        defer { store.close() }
        #expect(try Self.ids(store, "k") == ["a0", "a1", "a2", "b0"])
        try store.deleteBatch("k", zero: true)
        _ = try store.cutBatch(stream: "s", key: "j", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        #expect(
            try T.records(store.batchBody("j", stream: "s").body).records.map { "\($0.id) \($0.data)" } == [
                #"b1 {"n":1}"#, #"c0 {"n":0}"#, #"c1 {"n":1}"#,
            ])
        #expect(store.damagedRecords == 0)
    }

    /// A damaged packed frame breaks the rest of its context: the frames before it read, the
    /// records of it and after it (in that context) are dropped and counted, never read as
    /// other texts through a stale window. Damage is a flipped payload byte (the crc fails) or a
    /// frame no reader knows, crc and all (the next frame's `seq` then skips one).
    @Test(arguments: ["payload", "kind"]) func aDamagedPackedFrameBreaksTheRestOfItsContext(damage: String) throws {
        let path = T.tempPath()
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false)
            for i in 0..<10 { try T.enqueue(store, "s", [("r\(i)", #"{"event":"purchase","n":\#(i)}"#)]) }
            let bytes = try store.log.read(store.log.active)
            let packed = bytes.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count).frames }.filter {
                if case .packed? = $0.frame { return true } else { return false }
            }
            #expect(packed.count == 10)
            let f = packed[3]
            guard case .packed(_, _, _, _, _, 3, let dataStart)? = f.frame else {
                Issue.record("frame 3 is not the context's fourth")
                return
            }
            var frame = Array(bytes[f.offset..<(f.offset + f.length)])
            if damage == "payload" {
                frame[dataStart - f.offset] ^= 0x5a
            } else {
                frame[Frame.headBytes] = 99
                Frame.seal(&frame, at: 0)
            }
            try store.log.overwrite(store.log.active, at: f.offset, frame)
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        // The records of a frame no reader knows are not known either: six counted then.
        #expect(store.damagedRecords == (damage == "payload" ? 7 : 6))
        try T.enqueue(store, "s", [("after", #"{"event":"purchase","n":10}"#)])
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        let recs = try T.records(store.batchBody("k", stream: "s").body).records
        #expect(
            recs.map { "\($0.id) \($0.data)" } == (0..<3).map { #"r\#($0) {"event":"purchase","n":\#($0)}"# } + [
                #"after {"event":"purchase","n":10}"#
            ])
    }

    // MARK: Segments

    /// Full segments are closed; the oldest is removed once all it holds is delivered.
    @Test(arguments: [QueueCompression.none, .deflate]) func deliveredSegmentsAreRemoved(compression: QueueCompression) throws {
        let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: false, segmentBytes: 4096, compression: compression)
        defer { store.close() }
        var rng = SplitMix64(seed: 7)
        for round in 0..<20 {
            try T.enqueue(store, "s", T.numbered("r\(round)-", 0..<5).map { ($0.0, Self.noise(200, &rng)) })
            _ = try store.cutBatch(stream: "s", key: "k\(round)", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
            try store.deleteBatch("k\(round)")
        }
        #expect(store.log.active > 5, "several segments were written")
        #expect(store.log.numbers.count <= 2, "only the active one (and at most one before it) is left")
        #expect(try store.totalBytes() == 0)
    }

    /// A record that is never delivered does not keep every later segment: the oldest segment,
    /// mostly dead, is copied forward (its live records and its live batch's cut frame) and
    /// removed; the record keeps its batch and key, also after a restart.
    @Test(arguments: [QueueCompression.none, .deflate]) func aStuckRecordIsCopiedForward(compression: QueueCompression) throws {
        let path = T.tempPath()
        var rng = SplitMix64(seed: 8)
        do {
            let store = try UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: 4096, compression: compression)
            try T.enqueue(store, "stuck", [("x", #"{"stuck":true}"#)])
            _ = try store.cutBatch(stream: "stuck", key: "held", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
            for round in 0..<40 {
                try T.enqueue(store, "s", T.numbered("r\(round)-", 0..<5).map { ($0.0, Self.noise(200, &rng)) })
                _ = try store.cutBatch(stream: "s", key: "k\(round)", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
                try store.deleteBatch("k\(round)")
            }
            #expect(store.log.active > 10)
            #expect(store.log.numbers.count <= 3, "\(store.log.numbers)")
            #expect(try Self.ids(store, "held", "stuck") == ["x"])
            store.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: 4096, compression: compression)
        defer { store.close() }
        #expect(try store.summaries()["stuck"]?.pendingBatches == ["held"])
        #expect(try Self.ids(store, "held", "stuck") == ["x"])
        #expect(try T.enqueue(store, "stuck", [("x", "0")]).added == 0, "still queued")
    }

    /// Copy-forward weighs a segment's live records by what they take of it: packed records by
    /// their share of their frames, not by their uncompressed charge (which would make a segment
    /// of compressed records look live long after most of it is delivered). One stream's records
    /// stay queued, a sixth of all; the others are delivered: the files stay a few segments.
    @Test func packedRecordsAreWeighedByTheirShareOfTheSegment() throws {
        let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: false, segmentBytes: 4096)
        defer { store.close() }
        let data = #"{"appKey":"lowrate","eventName":"purchase","property":{"sku":"A-1","price":9.99}}"#
        for round in 0..<300 {
            try T.enqueue(store, "stuck", [("x\(round)", data)])
            try T.enqueue(store, "s", (0..<5).map { ("r\(round)-\($0)", data) })
            _ = try store.cutBatch(stream: "s", key: "k\(round)", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
            try store.deleteBatch("k\(round)")
        }
        // 300 queued records of ~150 bytes deflate to a few KiB: one segment and the active one,
        // give or take one being copied.
        #expect(store.log.active > 10, "several segments were written")
        #expect(store.log.numbers.count <= 4 && store.log.fileBytes <= 4 * 4096, "\(store.log.numbers.count) segments")
        #expect(try store.summaries()["stuck"]?.queued == 300)
        #expect(store.segmentUseErrors().isEmpty)
    }

    /// One process at a time: a second open of the same queue (an uploader started while its
    /// predecessor, whose host was killed, still runs) waits for the lock, then gives up.
    @Test func aSecondOpenWaitsForTheLock() throws {
        let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: false)
        #expect(throws: IOError.self) { try SegmentLog(dir: store.log.dir, maxSegmentBytes: 4096, fsyncEveryAppend: false, lockWaitMs: 40) }
        store.close()
        let again = try SegmentLog(dir: store.log.dir, maxSegmentBytes: 4096, fsyncEveryAppend: false, lockWaitMs: 0)
        again.close()
    }

    /// Files are the owner's only.
    @Test func segmentsAreMode0600InADirectoryOf0700() throws {
        let store = try UploaderStore(path: T.tempPath(), fsyncEveryCommit: true)
        defer { store.close() }
        try T.enqueue(store, "s", [("a", "1")])
        var st = stat()
        #expect(stat(store.log.path(store.log.active), &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(stat(store.log.dir, &st) == 0 && st.st_mode & 0o777 == 0o700)
    }

    // MARK: Format 3

    /// The schema of format 3 (the release before the segments), verbatim.
    static let formatThreeSchema = """
        CREATE TABLE IF NOT EXISTS chunks(
          seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, consent TEXT NOT NULL,
          first INTEGER NOT NULL, count INTEGER NOT NULL, bytes INTEGER NOT NULL,
          batch TEXT, enqueued_ms INTEGER NOT NULL);
        CREATE INDEX IF NOT EXISTS chunks_by_batch ON chunks(stream, batch, first);
        CREATE TABLE IF NOT EXISTS chunk_bodies(seq INTEGER PRIMARY KEY, body BLOB NOT NULL, idx BLOB NOT NULL);
        CREATE TABLE IF NOT EXISTS batches(
          key TEXT PRIMARY KEY, stream TEXT NOT NULL, created_ms INTEGER NOT NULL,
          attempts INTEGER NOT NULL DEFAULT 0, final INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE IF NOT EXISTS dead_letters(
          seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
          body TEXT NOT NULL, batch TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL,
          at_ms INTEGER NOT NULL, ts INTEGER);
        CREATE TABLE IF NOT EXISTS stream_settings(
          stream TEXT PRIMARY KEY, max_count INTEGER, interval_ms INTEGER, endpoint TEXT);
        CREATE TABLE IF NOT EXISTS stream_owners(
          stream TEXT PRIMARY KEY, owner TEXT NOT NULL, created_ms INTEGER NOT NULL);
        PRAGMA user_version=3;
        """

    /// A format-3 chunk row as that release's `insertChunk` wrote it.
    static func putChunk(
        _ db: Database, stream: String, consent: String, first: Int64, batch: String?, _ records: [(String, String, Int64)]
    ) throws {
        var c = Chunk()
        for (id, data, ts) in records {
            var escaped: [UInt8] = []
            JSONText.appendString(id, to: &escaped)
            escaped.withUnsafeBytes { i in Array(data.utf8).withUnsafeBytes { d in _ = c.append(escapedID: i, ts: ts, data: d) } }
        }
        try db.run(
            "INSERT INTO chunks(stream,consent,first,count,bytes,batch,enqueued_ms) VALUES(?,?,?,?,?,?,?)",
            [
                .text(stream), .text(consent), .int(first), .int(Int64(c.count)), .int(Int64(c.bytes)), batch.map { .text($0) } ?? .null,
                .int(500),
            ])
        let seq = db.lastInsertRowID
        try db.run("INSERT INTO chunk_bodies(seq,body,idx) VALUES(?,?,?)", [.int(seq), .blob(c.body), .blob(c.index)])
    }

    /// A format-3 queue — a pending batch (final), queued records of two streams and two
    /// switches, a chunk whose batch row is gone, a dead letter, an owner, saved settings — is
    /// migrated at the first open: every record is queued or in its batch as before, the batch
    /// keeps its key, the old tables are gone and their pages zeroed.
    @Test func aFormatThreeQueueIsMigratedAndDelivered() throws {
        let path = T.tempPath()
        let marker = "format-three-marker-"
        do {
            let old = try Database(path: path)
            try old.exec("PRAGMA journal_mode=WAL")
            try old.exec(Self.formatThreeSchema)
            try Self.putChunk(
                old, stream: "ma.app", consent: "ma.app", first: 0, batch: "oldbatch",
                [("e1", #"{"event":"a"}"#, 1), ("e2", #""\#(marker)""#, 2)])
            try Self.putChunk(old, stream: "other", consent: "legacy", first: 2, batch: nil, [("o1", "[1]", 3)])
            try Self.putChunk(
                old, stream: "ma.app", consent: "ma.app", first: 3, batch: nil, [("e\"3", #"{"event":"c"}"#, 4), ("e4", "4", 5)])
            try Self.putChunk(old, stream: "other", consent: "other", first: 5, batch: "vanished", [("o2", "[2]", 6)])
            try old.run("INSERT INTO batches(key,stream,created_ms,final) VALUES('oldbatch','ma.app',400,1)")
            try old.run(
                "INSERT INTO dead_letters(stream,id,body,batch,status,reason,at_ms,ts) VALUES('ma.app','x','1','b0',400,'HTTP 400',1,1)")
            try old.run("INSERT INTO stream_owners(stream,owner,created_ms) VALUES('other','uid:1000',1)")
            try old.run("INSERT INTO stream_settings(stream,max_count,interval_ms) VALUES('other',7,900)")
            old.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try store.db.query("SELECT name FROM sqlite_master WHERE name IN ('chunks','chunk_bodies','batches')").isEmpty)
        #expect(try store.db.query("PRAGMA user_version").first?[0].int == 4)
        #expect(access(UploaderStore.queueDirectory(path) + ".migrating", F_OK) != 0)
        let sums = try store.summaries()
        #expect(sums["ma.app"]?.pendingBatches == ["oldbatch"] && sums["ma.app"]?.queued == 2)
        #expect(sums["other"]?.queued == 2 && sums["other"]?.pendingBatches == [], "a chunk whose batch is gone is queued")
        #expect(try store.isFinal("oldbatch"))
        #expect(try store.recordedOwners()["other"] == "uid:1000" && store.deadLetterSummaries()["ma.app"]?.count == 1)
        #expect(try store.savedSettings()["other"]?.maxCount == 7)
        #expect(try store.consentKeys().sorted() == ["legacy", "ma.app", "other"])
        let charges = [
            T.charge("e1", #"{"event":"a"}"#, ts: 1), T.charge("e2", #""\#(marker)""#, ts: 2), T.charge("o1", "[1]", ts: 3),
            T.charge(#"e\"3"#, #"{"event":"c"}"#, ts: 4), T.charge("e4", "4", ts: 5), T.charge("o2", "[2]", ts: 6),
        ]
        #expect(try store.totalBytes() == charges.reduce(0, +))
        // The pending batch goes again as the same batch; purged, its bytes are gone everywhere.
        let resent = try T.records(store.batchBody("oldbatch", stream: "ma.app").body)
        #expect(resent.batch == "oldbatch" && resent.records.map(\.id) == ["e1", "e2"] && resent.records.map(\.ts) == [1, 2])
        try store.deleteBatch("oldbatch", zero: true)
        #expect(try !T.fileHolds(store, path, marker))
        // The queued records, in order, ids and data intact; still duplicates while queued.
        #expect(try T.enqueue(store, "ma.app", [("e4", "0"), ("e1", "0")]).added == 1)
        _ = try store.cutBatch(stream: "ma.app", key: "n1", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        let next = try T.records(store.batchBody("n1", stream: "ma.app").body)
        #expect(next.records.map(\.id) == ["e\"3", "e4", "e1"] && next.records.map(\.data) == [#"{"event":"c"}"#, "4", "0"])
        // Switches are kept: a cut does not mix them.
        #expect(try store.cutBatch(stream: "other", key: "o", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1) == (1, charges[2]))
        #expect(try store.cutBatch(stream: "other", key: "o2", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1) == (1, charges[5]))
    }

    /// A crash after the segments were written but before the old tables were dropped: the next
    /// open migrates again from the tables, once.
    @Test func anInterruptedMigrationRunsAgainOnce() throws {
        let path = T.tempPath()
        do {
            let old = try Database(path: path)
            try old.exec(Self.formatThreeSchema)
            try Self.putChunk(old, stream: "s", consent: "s", first: 0, batch: nil, [("a", "1", 1), ("b", "2", 2)])
            old.close()
        }
        // A half-written migration directory from the crashed start.
        let tmp = UploaderStore.queueDirectory(path) + ".migrating"
        try System.createDirectories(atPath: tmp, mode: 0o700)
        try System.writeFileAtomically(atPath: tmp + "/0000000001.seg", contents: Frame.segmentMagic + [1, 2, 3])
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try store.summaries()["s"]?.queued == 2)
    }
}

/// The queue against a model under random operations on small segments (rotation, removal and
/// copy-forward all the time), reopened now and then: every record enqueued is either delivered
/// once or still readable, in its batch or queued.
struct SegmentQueueModelTests {
    typealias T = StoreTests

    @Test(arguments: [1, 2, 3, 4, 5, 6], [QueueCompression.deflate, .none])
    func randomOperationsLoseNothing(seed: UInt64, compression: QueueCompression) throws {
        var rng = SplitMix64(seed: seed)
        func r(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
        let path = T.tempPath()
        var store = try UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: 2048, compression: compression)
        defer { store.close() }
        let streams = ["a", "b", "c"]
        var enqueued = Set<String>()
        var delivered = Set<String>()
        var live: [String: String] = [:]  // batch key -> stream
        var n = 0
        for step in 0..<PropertyRuns.count(1500) {
            let op = r(10)
            switch op {
            case 0...3:
                let s = streams[r(3)]
                let recs = (0..<(1 + r(5))).map { _ -> (String, String) in
                    n += 1
                    return ("\(s)\(n)", #"{"v":"\#(String(repeating: "x", count: r(150)))"}"#)
                }
                try T.enqueue(store, s, recs)
                enqueued.formUnion(recs.map(\.0))
            case 4, 5:
                let s = streams[r(3)]
                let key = "k\(step)"
                if try store.cutBatch(stream: s, key: key, maxCount: 1 + r(20), maxBytes: 1 << 20, final: false, nowMs: 1).count > 0 {
                    live[key] = s
                }
            case 6, 7:
                guard !live.isEmpty else { continue }
                let key = live.keys.sorted()[r(live.count)]
                let s = live[key]!
                let ids = try T.records(store.batchBody(key, stream: s).body).records.map(\.id)
                #expect(!ids.isEmpty)
                for id in ids { #expect(delivered.insert(id).inserted, "\(id) delivered twice at step \(step)") }
                live[key] = nil
                if r(2) == 0 {
                    store.deleteDelivered(key)
                    if r(2) == 0 { try store.applyDeliveredDeletes() }
                } else {
                    try store.deleteBatch(key, zero: r(2) == 0)
                }
            case 8:
                guard !live.isEmpty else { continue }
                let key = live.keys.sorted()[r(live.count)]
                try store.unbatch([key])
                live[key] = nil
            default:
                if r(4) == 0 {
                    try store.applyDeliveredDeletes()
                    let before = try store.summaries().mapValues { "\($0.queued) \($0.pendingBatches.sorted())" }
                    store.close()
                    store = try UploaderStore(path: path, fsyncEveryCommit: false, segmentBytes: 2048, compression: compression)
                    let after = try store.summaries().mapValues { "\($0.queued) \($0.pendingBatches.sorted())" }
                    #expect(before == after, "reopen at \(step)")
                    #expect(store.truncatedBytes == 0 && store.damagedRecords == 0, "reopen at \(step)")
                }
            }
            let errors = store.segmentUseErrors()
            #expect(errors.isEmpty, "step \(step) op \(op): \(errors)")
            if !errors.isEmpty { return }
            // Every live batch reads back.
            for (key, s) in live { _ = try store.batchBody(key, stream: s) }
        }
        // Drain: everything left is delivered once.
        for (key, s) in live {
            for id in try T.records(store.batchBody(key, stream: s).body).records.map(\.id) {
                #expect(delivered.insert(id).inserted)
            }
            try store.deleteBatch(key)
        }
        for s in streams {
            while true {
                let key = "d\(s)\(delivered.count)"
                guard try store.cutBatch(stream: s, key: key, maxCount: 500, maxBytes: 1 << 30, final: false, nowMs: 1).count > 0 else {
                    break
                }
                for id in try T.records(store.batchBody(key, stream: s).body).records.map(\.id) {
                    #expect(delivered.insert(id).inserted)
                }
                try store.deleteBatch(key)
            }
        }
        #expect(delivered == enqueued)
        #expect(store.log.numbers.count <= 2)
    }
}
