/// Splits a byte stream into `\n`-terminated lines, with a hard cap on line length.
///
/// Pure and allocation-light: lines wholly inside one read are handed out as views of that read;
/// only a line split across reads is copied into `carry`. A line longer than `maxLineBytes` is
/// never buffered: the framer discards up to the next newline and then reports `.oversized`
/// once, with the first bytes of the line (so the caller can still find an `id` to answer).
public struct LineFramer {
    public enum Event {
        /// One complete line, without its `\n`. Valid only during the callback.
        case line(UnsafeRawBufferPointer)
        /// A line of `bytes` bytes exceeded the limit and was skipped; `head` is its beginning.
        case oversized(bytes: Int, head: [UInt8])
    }

    public var maxLineBytes: Int
    /// How many leading bytes of an oversized line are kept for error reporting.
    public static let headBytes = 512

    private var carry: [UInt8] = []
    private var discarding = false
    private var discarded = 0
    private var head: [UInt8] = []

    public init(maxLineBytes: Int) { self.maxLineBytes = maxLineBytes }

    /// Bytes held for an incomplete line.
    public var bufferedBytes: Int { carry.count }
    /// True while skipping the rest of an oversized line.
    public var isDiscarding: Bool { discarding }

    public mutating func feed(_ chunk: UnsafeRawBufferPointer, _ emit: (Event) -> Void) {
        _ = feed(
            chunk,
            until: {
                emit($0); return true
            })
    }

    /// Feeds `chunk` while `emit` returns true. Returns how many bytes of `chunk` were consumed:
    /// all of them, or — when `emit` returned false — those up to and including the newline of
    /// the event it refused to continue after; the caller keeps the rest and feeds it later.
    public mutating func feed(_ chunk: UnsafeRawBufferPointer, until emit: (Event) -> Bool) -> Int {
        let n = chunk.count
        guard n > 0, let base = chunk.baseAddress else { return n }
        var start = 0
        while start < n {
            let found = memchrIndex(base, from: start, to: n)
            guard let nl = found else {
                let rest = n - start
                if discarding {
                    discarded += rest
                } else if carry.count + rest > maxLineBytes {
                    beginDiscard(UnsafeRawBufferPointer(rebasing: chunk[start..<n]))
                } else {
                    carry.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[start..<n]))
                }
                return n
            }
            var more = true
            let piece = UnsafeRawBufferPointer(rebasing: chunk[start..<nl])
            if discarding {
                discarded += piece.count
                let total = discarded
                discarding = false
                discarded = 0
                more = emit(.oversized(bytes: total, head: head))
                head = []
            } else if carry.isEmpty {
                if piece.count > maxLineBytes {
                    more = emit(.oversized(bytes: piece.count, head: Array(piece.prefix(Self.headBytes))))
                } else {
                    more = emit(.line(piece))
                }
            } else {
                let total = carry.count + piece.count
                if total > maxLineBytes {
                    var h = Array(carry.prefix(Self.headBytes))
                    if h.count < Self.headBytes { h.append(contentsOf: piece.prefix(Self.headBytes - h.count)) }
                    more = emit(.oversized(bytes: total, head: h))
                } else {
                    carry.append(contentsOf: piece)
                    more = carry.withUnsafeBytes { emit(.line($0)) }
                }
                carry.removeAll(keepingCapacity: carry.capacity <= 64 * 1024)
            }
            start = nl + 1
            if !more { return start }
        }
        return n
    }

    private mutating func beginDiscard(_ rest: UnsafeRawBufferPointer) {
        head = Array(carry.prefix(Self.headBytes))
        if head.count < Self.headBytes { head.append(contentsOf: rest.prefix(Self.headBytes - head.count)) }
        discarded = carry.count + rest.count
        discarding = true
        carry = []
    }
}

@inline(__always)
private func memchrIndex(_ base: UnsafeRawPointer, from: Int, to: Int) -> Int? {
    guard let p = memchr(base + from, 0x0A, to - from) else { return nil }
    return base.distance(to: UnsafeRawPointer(p))
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
