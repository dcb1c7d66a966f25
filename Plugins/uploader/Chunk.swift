import PylonCore

/// Records of one stream under one consent switch, stored as one row: the records already in the
/// batch body's form, `{"id":…,"ts":…,"data":…}` joined by commas, so a batch's body is the
/// concatenation of its chunks and sending is a read plus gzip. `index` holds, per record, the
/// end offset of its text in `body` and the bytes of its `data` (both UInt32, little-endian):
/// enough to split a chunk between records and to read one record back (dead letters).
///
/// What a record counts in the disk cap (`bytes`, `charge`) is what it costs to keep: its text
/// in the body (id, ts and data in the upload form) and its separator, its index entry, and its
/// key in the in-memory duplicate check. Counting only `data` let records of `"data":0` with
/// long ids take ~150 bytes of disk and memory per byte counted.
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
    /// What the records count in the disk cap: the sum of their `charge`s.
    var bytes = 0

    /// About what a record's key costs in the in-memory duplicate check (a 16-byte key in a
    /// hash set at its load factor).
    static let keyMemoryBytes = 32

    /// What a record whose upload form is `textBytes` long counts in the disk cap: that text and
    /// one separator, its index entry and its duplicate-check key. Additive: the charges of a
    /// chunk's records add up to its `bytes` however it is split.
    static func charge(textBytes: Int) -> Int { textBytes + 1 + indexEntryBytes + keyMemoryBytes }

    /// A charge estimated before the record is stored (the admission check): `idBytes` as given
    /// (escaping can only add), `dataBytes` as stored, and the longest `ts`.
    static func estimatedCharge(idBytes: Int, dataBytes: Int) -> Int { charge(textBytes: idBytes + 2 + dataBytes + recordOverhead) }

    init() {}

    /// An empty chunk whose body has room for `bytes` without growing.
    init(reservingBody bytes: Int) { body.reserveCapacity(bytes) }

    /// Bytes of a record's upload form besides its id and data: `{"id":`, `,"ts":` and up to
    /// 20 digits, `,"data":`, `}` and the comma before it.
    static let recordOverhead = 48

    init(body: [UInt8], index: [UInt8]) {
        self.body = body
        self.index = index
        count = index.count / Chunk.indexEntryBytes
        bytes = Chunk.bytes(bodyCount: body.count, count: count)
    }

    /// `bytes` of a chunk of `count` records whose body is `bodyCount` long: the records' texts
    /// are the body but its `count - 1` separators.
    static func bytes(bodyCount: Int, count: Int) -> Int {
        count == 0 ? 0 : (bodyCount - (count - 1)) + count * charge(textBytes: 0)
    }

    var isEmpty: Bool { count == 0 }
    var isFull: Bool { body.count >= Chunk.targetBytes || count >= Chunk.targetRecords }

    /// Appends a record: `escapedID` is the id as a JSON string literal (quotes included),
    /// `data` its JSON text. Returns its charge.
    @discardableResult
    mutating func append(escapedID: UnsafeRawBufferPointer, ts: Int64, data: UnsafeRawBufferPointer) -> Int {
        if count > 0 { body.append(UInt8(ascii: ",")) }
        let start = body.count
        body.append(contentsOf: Chunk.idPrefix)
        body.append(contentsOf: escapedID)
        body.append(contentsOf: #","ts":"#.utf8)
        JSONText.appendDecimal(ts, to: &body)
        body.append(contentsOf: #","data":"#.utf8)
        body.append(contentsOf: data)
        body.append(UInt8(ascii: "}"))
        // The index entry as one 8-byte append (little-endian on every platform Pylon runs on).
        withUnsafeBytes(of: (UInt32(body.count).littleEndian, UInt32(data.count).littleEndian)) { index.append(contentsOf: $0) }
        count += 1
        let c = Chunk.charge(textBytes: body.count - start)
        bytes += c
        return c
    }

    /// Appends a record's whole text as stored (`RecordText`). Returns its charge.
    @discardableResult
    mutating func appendText(_ t: UnsafeRawBufferPointer) -> Int {
        if count > 0 { body.append(UInt8(ascii: ",")) }
        body.append(contentsOf: t)
        let data = RecordText.parts(t)?.data.count ?? 0
        withUnsafeBytes(of: (UInt32(body.count).littleEndian, UInt32(data).littleEndian)) { index.append(contentsOf: $0) }
        count += 1
        let c = Chunk.charge(textBytes: t.count)
        bytes += c
        return c
    }

    /// The charge of record `i` (from the index alone).
    static func charge(_ index: UnsafeRawBufferPointer, _ i: Int) -> Int { charge(textBytes: span(index, i).count) }

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

    /// Record `i`'s `ts` (written by `append` as decimal digits after the id).
    static func ts(_ body: UnsafeRawBufferPointer, _ index: UnsafeRawBufferPointer, _ i: Int) -> Int64 {
        let id = record(body, index, i).escapedID
        var j = id.baseAddress! - body.baseAddress! + id.count + #","ts":"#.utf8.count
        let end = span(index, i).upperBound
        var negative = false
        if j < end, body[j] == UInt8(ascii: "-") {
            negative = true
            j += 1
        }
        var v: Int64 = 0
        while j < end, body[j] >= 0x30, body[j] <= 0x39 {
            v = v &* 10 &+ Int64(body[j] - 0x30)
            j += 1
        }
        return negative ? -v : v
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

/// The dedup key of a record: a 128-bit keyed hash (SipHash-1-3 with its 128-bit output, keyed
/// with a random key of the process) of its id as written. Rebuilt from the queue at every
/// start, so the key need not be stable. Two different ids share a key with probability
/// ~n²/2¹²⁹ (n records queued in one stream): 10⁶ queued records give ~10⁻²⁷.
struct RecordKey: Hashable {
    var a: UInt64
    var b: UInt64

    /// The process's SipHash key.
    static let key = (UInt64.random(in: .min ... .max), UInt64.random(in: .min ... .max))

    init(_ escapedID: UnsafeRawBufferPointer) { (a, b) = SipHash128.hash(escapedID, key: RecordKey.key) }

    func hash(into hasher: inout Hasher) { hasher.combine(a) }

    /// A set places a key by `a` mixed with the set's own seed, without running `Hasher` (what
    /// `hash(into:)` would cost on every insert, lookup and removal): `a` is already a keyed
    /// hash of the id (equality still compares both halves).
    func _rawHashValue(seed: Int) -> Int {
        var x = a ^ UInt64(bitPattern: Int64(seed))
        x = (x ^ (x >> 32)) &* 0xd6e8_feb8_6659_fd93
        return Int(truncatingIfNeeded: x ^ (x >> 32))
    }
}
