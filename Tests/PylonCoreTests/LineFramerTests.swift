import Testing

@testable import PylonCore

/// Feeds chunks and records what the framer emits.
private func frame(_ chunks: [String], max: Int = 64) -> [String] {
    var f = LineFramer(maxLineBytes: max)
    var out: [String] = []
    for c in chunks {
        Array(c.utf8).withUnsafeBytes { buf in
            f.feed(buf) { ev in
                switch ev {
                case .line(let l): out.append("L:" + String(decoding: l, as: UTF8.self))
                case .oversized(let n, let head): out.append("O:\(n):" + String(decoding: head.prefix(4), as: UTF8.self))
                }
            }
        }
    }
    return out
}

struct LineFramerTests {
    @Test func manyLinesInOneRead() {
        #expect(frame(["a\nbb\nccc\n"]) == ["L:a", "L:bb", "L:ccc"])
    }

    @Test func lineSplitAcrossReads() {
        #expect(frame(["{\"a\"", ":1", "}\n{\"b\":2}\n"]) == ["L:{\"a\":1}", "L:{\"b\":2}"])
    }

    @Test func everyByteSeparately() {
        let text = "hello\nworld\n"
        #expect(frame(text.map { String($0) }) == ["L:hello", "L:world"])
    }

    @Test func incompleteTailIsHeld() {
        var f = LineFramer(maxLineBytes: 64)
        var n = 0
        Array("abc\ndef".utf8).withUnsafeBytes { f.feed($0) { _ in n += 1 } }
        #expect(n == 1)
        #expect(f.bufferedBytes == 3)
    }

    @Test func lineAtExactLimitPasses() {
        let line = String(repeating: "x", count: 16)
        #expect(frame([line + "\n"], max: 16) == ["L:" + line])
    }

    @Test func oversizedLineInOneReadIsSkippedAndReported() {
        let big = String(repeating: "y", count: 17)
        #expect(frame([big + "\nok\n"], max: 16) == ["O:17:yyyy", "L:ok"])
    }

    @Test func oversizedLineAcrossReadsIsDiscardedUntilNewline() {
        let out = frame(["abcdefgh", "ijklmnop", "qrstuvwx", "yz\nnext\n"], max: 10)
        #expect(out == ["O:26:abcd", "L:next"])
    }

    @Test func oversizedDetectedWhenCarryPlusTailExceeds() {
        let out = frame(["abcdef", "ghijk\n"], max: 10)
        #expect(out == ["O:11:abcd"])
    }

    @Test func discardModeDoesNotBuffer() {
        var f = LineFramer(maxLineBytes: 8)
        for _ in 0..<100 {
            Array("0123456789".utf8).withUnsafeBytes { f.feed($0) { _ in } }
        }
        #expect(f.isDiscarding)
        #expect(f.bufferedBytes == 0)
    }
}

/// Stopping mid-read: the framer hands back where it stopped, and the rest feeds later unchanged.
struct LineFramerPauseTests {
    @Test func stopsAfterTheRefusedLineAndResumesWithTheRest() {
        var f = LineFramer(maxLineBytes: 100)
        var lines: [String] = []
        let input = Array("a\nbb\nccc\ndd".utf8)
        let consumed = input.withUnsafeBytes { buf in
            f.feed(
                buf,
                until: { ev in
                    if case .line(let l) = ev { lines.append(String(decoding: l, as: UTF8.self)) }
                    return lines.count < 2
                })
        }
        #expect(lines == ["a", "bb"])
        #expect(consumed == 5)
        let rest = Array(input[consumed...])
        let all = rest.withUnsafeBytes { buf in
            f.feed(
                buf,
                until: { ev in
                    if case .line(let l) = ev { lines.append(String(decoding: l, as: UTF8.self)) }
                    return true
                })
        }
        #expect(all == rest.count)
        #expect(lines == ["a", "bb", "ccc"])
        #expect(f.bufferedBytes == 2, "the partial 'dd' waits for its newline")
    }

    @Test func aLineCompletedFromCarryCanStopTheFeed() {
        var f = LineFramer(maxLineBytes: 100)
        var lines: [String] = []
        Array("par".utf8).withUnsafeBytes { _ = f.feed($0, until: { _ in true }) }
        let consumed = Array("tial\nnext\n".utf8).withUnsafeBytes { buf in
            f.feed(
                buf,
                until: { ev in
                    if case .line(let l) = ev { lines.append(String(decoding: l, as: UTF8.self)) }
                    return false
                })
        }
        #expect(lines == ["partial"])
        #expect(consumed == 5)
        #expect(f.bufferedBytes == 0)
    }
}
