import PylonStore

extension QueueIndex {
    /// Rebuilds the index from the segments' frames, in log order (`UploaderStore.replay` reads
    /// the files and repairs what `Result` names). Records are taken frame by frame; the ledger
    /// (cuts, final marks, ends, dissolutions) is applied at `finish`, once every record is
    /// known, since a batch's records may sit in a later segment (copied forward). Pure: the
    /// segments' bytes are passed in.
    struct Replay {
        private(set) var index = QueueIndex()
        private var seen = Set<Int64>()
        private var ledger: [Ledger] = []
        private var damaged: [FrameAt] = []
        private var unreadable: [(stream: String, pos: Int64)] = []
        private var unreadableFrames: [(frame: FrameAt, dataStart: Int)] = []
        private var maxPos: Int64 = -1
        /// The segment being read, its lanes and its packed contexts.
        private var seg: UInt32 = 0
        private var lanes: [UInt64: (stream: String, consent: Int32)] = [:]
        private var contexts = PackedContexts()

        private enum Ledger {
            case cut(seg: UInt32, key: String, stream: String, final: Bool, seq: UInt64, createdMs: Int64, runs: [ClosedRange<Int64>])
            case final([String])
            case ended([Frame.Ended])
            case unbatch([String])
        }

        /// A frame in a segment file.
        struct FrameAt: Equatable {
            var seg: UInt32
            var offset: Int
            var length: Int
        }

        /// What the replay found besides the index.
        struct Result {
            var index: QueueIndex
            /// Records lost to damage (not ended, not read elsewhere), each position once.
            var damagedRecords: Int
            /// Frames failing their crc inside a segment: to be rewritten with what is not live
            /// zeroed and a crc that matches.
            var damaged: [FrameAt]
            /// Packed frames no context reads (zeroed by a purge, damaged, or after one such):
            /// their payloads (from `dataStart`) to be zeroed, whatever a decoder could guess.
            var unreadableFrames: [(frame: FrameAt, dataStart: Int)]
        }

        /// The frames that follow are segment `n`'s: its lanes and contexts start empty.
        mutating func beginSegment(_ n: UInt32) {
            seg = n
            lanes = [:]
            contexts = PackedContexts()
        }

        /// Applies frame `f` of the current segment, whose bytes are `bytes`.
        mutating func apply(_ f: Frame.Found, in bytes: UnsafeRawBufferPointer) throws {
            if !f.crcOK { damaged.append(FrameAt(seg: seg, offset: f.offset, length: f.length)) }
            switch f.frame {
            case .lane(let id, let stream, let consent)?:
                lanes[id] = (stream, index.consentID(consent))
            case .records(let lane, let first, let ms, let deltas, let lengths, let textStart)?:
                guard let l = lanes[lane] else { return }
                let texts = UnsafeRawBufferPointer(rebasing: bytes[textStart...])
                take(l, frame: f.offset, first: first, deltas: deltas, lengths: lengths, texts: texts, ms: ms) { at, _ in
                    (textStart + at, .plain)
                }
            case .packed(let lane, let first, let ms, let deltas, let lengths, let seq, let dataStart)?:
                guard let l = lanes[lane] else { return }
                let texts = try contexts.texts(
                    lane: lane, seq: seq, offset: f.offset, crcOK: f.crcOK,
                    payload: UnsafeRawBufferPointer(rebasing: bytes[dataStart..<(f.offset + f.length)]), lengths: lengths)
                if texts == nil && f.crcOK {
                    unreadableFrames.append((FrameAt(seg: seg, offset: f.offset, length: f.length), dataStart))
                }
                let context = UInt32(f.offset - (contexts.lanes[lane]?.start ?? f.offset))
                let textBytes = Frame.textBytes(lengths)
                (texts ?? []).withUnsafeBytes { t in
                    take(l, frame: f.offset, first: first, deltas: deltas, lengths: lengths, texts: texts == nil ? nil : t, ms: ms) {
                        at, len in (at, .packed(context: context, share: Rec.share(frameBytes: f.length, textBytes: textBytes, len: len)))
                    }
                }
            case .cut(let key, let stream, let fin, let seq, let ms, let runs)?:
                // New positions never reuse one a batch names, though its records were in a
                // quarantined segment (they would join that batch at the next replay).
                for r in runs { maxPos = max(maxPos, r.upperBound) }
                ledger.append(.cut(seg: seg, key: key, stream: stream, final: fin, seq: seq, createdMs: ms, runs: runs))
            case .final(let keys)?: ledger.append(.final(keys))
            case .done(let keys, _)?: ledger.append(.ended(keys.map { Frame.Ended(key: $0, stream: "", runs: []) }))
            case .ended(let entries, _)?:
                for e in entries { for r in e.runs { maxPos = max(maxPos, r.upperBound) } }
                ledger.append(.ended(entries))
            case .unbatch(let keys)?: ledger.append(.unbatch(keys))
            case nil: break
            }
        }

        /// Takes the records of the frame at `frame`: positions `first` + `deltas`, texts of
        /// `lengths` joined by commas in `texts` (nil: unreadable); `locate` gives a record's
        /// text offset and placement from its offset in `texts` and its length. A position
        /// already read (a forward copy's original) is skipped; a text that is not a record's is
        /// counted.
        private mutating func take(
            _ lane: (stream: String, consent: Int32), frame: Int, first: Int64, deltas: [UInt64], lengths: [Int],
            texts: UnsafeRawBufferPointer?, ms: Int64, _ locate: (Int, Int) -> (text: Int, place: Placement)
        ) {
            var pos = first
            var at = 0
            for (i, len) in lengths.enumerated() {
                if i > 0 { pos += Int64(deltas[i - 1]) }
                defer { at += len + 1 }
                maxPos = max(maxPos, pos)
                guard !seen.contains(pos) else { continue }
                guard let t = texts, let id = RecordText.escapedID(UnsafeRawBufferPointer(rebasing: t[at..<(at + len)])) else {
                    unreadable.append((lane.stream, pos))
                    continue
                }
                seen.insert(pos)
                let w = locate(at, len)
                let rec = Rec(
                    pos: pos, seg: seg, frame: frame, text: w.text, len: Int32(len), consent: lane.consent, place: w.place,
                    enqueuedMs: ms, key: RecordKey(id))
                index.appendReplayed(rec, to: lane.stream)
            }
        }

        /// Applies the ledger in log order and settles the index.
        mutating func finish() -> Result {
            index.nextPosition = maxPos + 1
            index.sortQueues()
            // Runs of batches ended (delivered, purged, set aside): their records are gone
            // whatever their texts read as.
            var endedRuns: [String: [ClosedRange<Int64>]] = [:]
            for entry in ledger {
                switch entry {
                case .cut(let seg, let key, let stream, let fin, let seq, let ms, let runs):
                    guard index.batchIDs[key] == nil else { continue }
                    let positions = index.queues[stream]?.positions(in: runs, state: .queued) ?? []
                    index.addBatch(
                        Batch(key: key, stream: stream, final: fin, seq: seq, createdMs: ms, runs: runs, positions: positions, cutSeg: seg),
                        countCut: false)
                    index.nextCutSeq = max(index.nextCutSeq, seq + 1)
                case .final(let keys): index.markFinal(keys)
                case .ended(let entries):
                    for e in entries {
                        if let b = index.batch(e.key) {
                            endedRuns[b.stream, default: []] += b.runs
                            index.removeBatch(e.key, recordsGone: true)
                            continue
                        }
                        // Its cut frame is gone with an older segment: its records end by their runs.
                        endedRuns[e.stream, default: []] += e.runs
                        index.endQueued(stream: e.stream, runs: e.runs)
                    }
                case .unbatch(let keys): for k in keys { index.removeBatch(k, recordsGone: false) }
                }
            }
            // Texts that do not read as records: zeroed by a purge (a packed context is zeroed
            // whole, its delivered records' texts too) or damaged (then lost, and counted, unless
            // ended or read elsewhere: a forward copy; a position counts once).
            let lost = unreadable.filter { u in !seen.contains(u.pos) && !(endedRuns[u.stream] ?? []).contains { $0.contains(u.pos) } }
            index.settle()
            return Result(index: index, damagedRecords: lost.count, damaged: damaged, unreadableFrames: unreadableFrames)
        }
    }
}
