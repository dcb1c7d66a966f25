import PylonCore

/// Records of one stream under one consent switch, stored as one row: the records already in the
/// batch body's form, `{"id":…,"ts":…,"data":…}` joined by commas, so a batch's body is the
/// concatenation of its chunks and sending is a read plus gzip. `index` holds, per record, the
/// end offset of its text in `body` and the bytes of its `data` (both UInt32, little-endian):
/// enough to split a chunk between records, to read one record back (dead letters) and to count
/// the disk cap's bytes.
struct Chunk {
    static let indexEntryBytes = 8
    /// A group commit starts another chunk for the same stream past this many bytes of body or
    /// records, so cutting a batch out of a chunk never rewrites more than this (plus a record):
    /// a commit of large records would otherwise be rewritten at every split.
    static let targetBytes = 256 * 1024
    static let targetRecords = 500
    /// Ids are 1-128 bytes (escaped at most 6×) and records are capped well below 4 GiB.
    static let idPrefix = Array(#"{"id":"#.utf8)

    var body: [UInt8] = []
    var index: [UInt8] = []
    var count = 0
    /// Bytes of the records' `data` (what they count in the disk cap).
    var bytes = 0

    init() {}

    init(body: [UInt8], index: [UInt8]) {
        self.body = body
        self.index = index
        count = index.count / Chunk.indexEntryBytes
        bytes = (0..<count).reduce(0) { $0 + Int(Chunk.u32(index, $1 * Chunk.indexEntryBytes + 4)) }
    }

    var isEmpty: Bool { count == 0 }
    var isFull: Bool { body.count >= Chunk.targetBytes || count >= Chunk.targetRecords }

    /// Appends a record: `escapedID` is the id as a JSON string literal (quotes included),
    /// `data` its JSON text.
    mutating func append(escapedID: UnsafeRawBufferPointer, ts: Int64, data: UnsafeRawBufferPointer) {
        if count > 0 { body.append(UInt8(ascii: ",")) }
        body.append(contentsOf: Chunk.idPrefix)
        body.append(contentsOf: escapedID)
        body.append(contentsOf: #","ts":"#.utf8)
        JSONText.appendDecimal(ts, to: &body)
        body.append(contentsOf: #","data":"#.utf8)
        body.append(contentsOf: data)
        body.append(UInt8(ascii: "}"))
        Chunk.appendU32(&index, UInt32(body.count))
        Chunk.appendU32(&index, UInt32(data.count))
        count += 1
        bytes += data.count
    }

    /// Record `i`'s text span in `body`.
    static func span(_ index: UnsafeRawBufferPointer, _ i: Int) -> Range<Int> {
        let end = Int(u32(index, i * indexEntryBytes))
        let start = i == 0 ? 0 : Int(u32(index, (i - 1) * indexEntryBytes)) + 1
        return start..<end
    }

    /// The `data` bytes of record `i`.
    static func dataBytes(_ index: UnsafeRawBufferPointer, _ i: Int) -> Int { Int(u32(index, i * indexEntryBytes + 4)) }

    /// Record `i`'s id as written (a JSON string literal, quotes included) and its `data` text.
    static func record(_ body: UnsafeRawBufferPointer, _ index: UnsafeRawBufferPointer, _ i: Int)
        -> (escapedID: UnsafeRawBufferPointer, data: UnsafeRawBufferPointer)
    {
        let r = span(index, i)
        let idStart = r.lowerBound + idPrefix.count
        var j = idStart + 1
        while j < r.upperBound, body[j] != UInt8(ascii: "\"") { j += body[j] == UInt8(ascii: "\\") ? 2 : 1 }
        let n = dataBytes(index, i)
        return (
            UnsafeRawBufferPointer(rebasing: body[idStart..<min(j + 1, r.upperBound)]),
            UnsafeRawBufferPointer(rebasing: body[(r.upperBound - 1 - n)..<(r.upperBound - 1)])
        )
    }

    /// Splits after the first `k` records (0 < k < count): the head and the rest.
    func split(at k: Int) -> (head: Chunk, tail: Chunk) {
        index.withUnsafeBytes { ix in
            let cut = Int(Chunk.u32(ix, (k - 1) * Chunk.indexEntryBytes))
            var tailIndex: [UInt8] = []
            tailIndex.reserveCapacity((count - k) * Chunk.indexEntryBytes)
            for i in k..<count {
                Chunk.appendU32(&tailIndex, Chunk.u32(ix, i * Chunk.indexEntryBytes) - UInt32(cut + 1))
                Chunk.appendU32(&tailIndex, Chunk.u32(ix, i * Chunk.indexEntryBytes + 4))
            }
            return (
                Chunk(body: Array(body[..<cut]), index: Array(index[..<(k * Chunk.indexEntryBytes)])),
                Chunk(body: Array(body[(cut + 1)...]), index: tailIndex)
            )
        }
    }

    static func u32<B: RandomAccessCollection>(_ b: B, _ at: Int) -> UInt32 where B.Element == UInt8, B.Index == Int {
        let s = b.startIndex + at
        return UInt32(b[s]) | UInt32(b[s + 1]) << 8 | UInt32(b[s + 2]) << 16 | UInt32(b[s + 3]) << 24
    }

    static func appendU32(_ out: inout [UInt8], _ v: UInt32) {
        out.append(UInt8(truncatingIfNeeded: v))
        out.append(UInt8(truncatingIfNeeded: v >> 8))
        out.append(UInt8(truncatingIfNeeded: v >> 16))
        out.append(UInt8(truncatingIfNeeded: v >> 24))
    }
}

/// The dedup key of a record: a 128-bit keyed hash (two SipHash-1-3 runs with the process's
/// random seed) of its id as written. Rebuilt from the queue at every start, so the seed need not
/// be stable. Two different ids share a key with probability ~n²/2¹²⁹ (n records queued in one
/// stream): 10⁶ queued records give ~10⁻²⁷.
struct RecordKey: Hashable {
    var a: Int
    var b: Int

    init(_ escapedID: UnsafeRawBufferPointer) {
        var h1 = Hasher()
        h1.combine(bytes: escapedID)
        var h2 = Hasher()
        h2.combine(0x5bd1_e995 as UInt32)
        h2.combine(bytes: escapedID)
        a = h1.finalize()
        b = h2.finalize()
    }

    /// `a` alone places a key in a set: it is already a keyed hash of the id (equality still
    /// compares both halves), so the set hashes 8 bytes per lookup instead of 16.
    func hash(into hasher: inout Hasher) { hasher.combine(a) }
}
