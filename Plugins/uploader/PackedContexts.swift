import PylonStore

/// How a lane's packed frames are deflated (docs/UPLOADER.md "On disk"): one raw-deflate
/// stream per lane in the active segment (PylonStore's `Deflater`), `windowBits` and `memLevel`
/// small, so a lane costs `memoryBytes`.
enum LaneDeflate {
    /// zlib's level 3 (its fast strategy): within a byte per record of level 9 on near-identical
    /// records, at about half the CPU of level 6.
    static let level: Int32 = 3
    /// A 4 KiB window: some twenty records of a device's event back, all a record repeats.
    static let windowBits: Int32 = 12
    static let memLevel: Int32 = 2
    /// What zlib allocates for one stream: `(1 << (windowBits + 2)) + (1 << (memLevel + 9))`
    /// plus its state (about 6 KiB).
    static let memoryBytes = (1 << (Int(windowBits) + 2)) + (1 << (Int(memLevel) + 9)) + 6 * 1024

    /// A lane's stream, the writer of its packed frames.
    static func deflater() throws -> Deflater {
        try Deflater(format: .raw, level: level, windowBits: windowBits, memLevel: memLevel)
    }

    /// A reader of packed frames, fed a context's frames in order: the largest window, so it
    /// reads whatever window the writer used.
    static func inflater() throws -> Inflater { try Inflater(format: .raw, windowBits: 15) }
}

/// The packed contexts of one segment followed frame by frame in file order (the replay, and
/// the tests that look for what a file still gives up): per lane one inflate stream, where its
/// context starts and the `seq` it expects next. A frame that is not its lane's next, fails its
/// crc or does not inflate to its texts breaks the rest of its context, up to the next `seq` 0.
struct PackedContexts {
    struct Context {
        let inflater: Inflater
        /// The offset of the context's first frame.
        var start: Int
        var seq: UInt64
        var broken: Bool
    }

    private(set) var lanes: [UInt64: Context] = [:]

    /// The texts (joined by commas) of packed frame `seq` of `lane` at `offset`, whose deflated
    /// payload is `payload`; nil when its context cannot read it.
    mutating func texts(
        lane: UInt64, seq: UInt64, offset: Int, crcOK: Bool, payload: UnsafeRawBufferPointer, lengths: [Int]
    ) throws -> [UInt8]? {
        if seq == 0 {
            if let c = lanes[lane] {
                c.inflater.reset()
                lanes[lane] = Context(inflater: c.inflater, start: offset, seq: 0, broken: false)
            } else {
                lanes[lane] = Context(inflater: try LaneDeflate.inflater(), start: offset, seq: 0, broken: false)
            }
        }
        guard var c = lanes[lane] else { return nil }
        var texts: [UInt8]?
        if crcOK, !c.broken, c.seq == seq { texts = c.inflater.inflate(payload, expected: Frame.textBytes(lengths)) }
        c.broken = texts == nil
        c.seq = seq + 1
        lanes[lane] = c
        return texts
    }
}
