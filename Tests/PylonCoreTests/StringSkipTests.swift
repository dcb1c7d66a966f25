import CJSONC
import Testing

@testable import PylonCore

/// The scanners skip string bodies 8 bytes at a time (`RawJSON.skipPlain`). Long strings with the
/// bytes that matter (quote, backslash, control, non-ASCII) at every offset within a word, checked
/// against a byte-by-byte reading and against json-c.
struct StringSkipTests {
    static let plain: [UInt8] = Array("abcXYZ019 :,{}[]-_/~".utf8)
    static let special: [UInt8] = [0x22, 0x5C, 0x00, 0x09, 0x1F, 0x7F, 0x80, 0xC3, 0xFF]

    /// True for the bytes `skipPlain` must stop at.
    static func stops(_ c: UInt8, control: Bool) -> Bool {
        c == 0x22 || c == 0x5C || (control && (c < 0x20 || c >= 0x80))
    }

    @Test func skipPlainStopsAtTheFirstByteThatMatters() {
        var rng = SplitMix64(seed: 0x51_4d)
        for _ in 0..<20_000 {
            let n = Int(rng.next() % 40)
            var b = (0..<n).map { _ in Self.plain[Int(rng.next() % UInt64(Self.plain.count))] }
            for _ in 0..<(rng.next() % 3) where n > 0 {
                b[Int(rng.next() % UInt64(n))] = Self.special[Int(rng.next() % UInt64(Self.special.count))]
            }
            let from = n == 0 ? 0 : Int(rng.next() % UInt64(n + 1))
            for control in [false, true] {
                let r = b.withUnsafeBytes { RawJSON.skipPlain($0, from, stopAtControl: control) }
                let first = (from..<n).first { Self.stops(b[$0], control: control) }
                if let first, first - from < (n - from) / 8 * 8 {
                    // The match lies in a whole word: found exactly.
                    #expect(r == first, "\(b) from \(from) control \(control)")
                } else {
                    // No match in the whole words: stops where fewer than 8 bytes remain.
                    #expect(r == from + (n - from) / 8 * 8, "\(b) from \(from) control \(control)")
                }
            }
        }
    }

    /// A message whose params hold one long string, its `id` after it.
    static func message(_ body: [UInt8]) -> [UInt8] {
        Array(#"{"jsonrpc":"2.0","method":"a.b","params":{"s":""#.utf8) + body + Array(#""},"id":7}"#.utf8)
    }

    @Test func longStringsAreJudgedAsJsonCJudgesThem() {
        var rng = SplitMix64(seed: 0x10_06)
        let pieces: [[UInt8]] = [
            Array("é".utf8), Array("日本".utf8), Array("😀".utf8), Array(#"\""#.utf8), Array(#"\\"#.utf8), Array(#"\n"#.utf8),
            Array(#"\u0041"#.utf8), [0x01], [0x1F], [0xC3], [0xED, 0xA0, 0x80], [0xFF], [0x22], [0x5C],
        ]
        var accepted = 0
        for round in 0..<5_000 {
            var body: [UInt8] = []
            let clean = round % 2 == 0  // only bytes a strict parser accepts
            for _ in 0..<Int(rng.next() % 40) {
                if rng.next() % 5 == 0 {
                    let p = pieces[Int(rng.next() % UInt64(clean ? 7 : pieces.count))]
                    body += p
                } else {
                    body.append(Self.plain[Int(rng.next() % UInt64(Self.plain.count))])
                }
            }
            let line = Self.message(body)
            let spans = line.withUnsafeBytes { RawJSON.spans($0, maxDepth: 32) }
            if clean { #expect(spans != nil, "valid message refused: \(String(decoding: line, as: UTF8.self))") }
            guard let spans else { continue }
            accepted += 1
            let ok = line.withUnsafeBytes { (try? Tokener(maxDepth: 64).parse($0)) != nil }
            #expect(ok, "scanner accepted what json-c rejects: \(line)")
            #expect(line.withUnsafeBytes { RawJSON.memberValueSpan($0, key: "id") } == spans.id)
            #expect(spans.id.map { Array(line[$0]) } == Array("7".utf8))
        }
        #expect(accepted > 2_000)
    }

    @Test func longStringsAreTheirOwnCanonicalFormAndReadAsJsonCReadsThem() throws {
        var rng = SplitMix64(seed: 0xda7a)
        let pieces = [#"\""#, #"\\"#, #"\n"#, #"\t"#, "é", "日本", "😀", " ", ":"]
        for _ in 0..<3_000 {
            var s = ""
            for _ in 0..<Int(rng.next() % 48) {
                s += rng.next() % 4 == 0 ? pieces[Int(rng.next() % UInt64(pieces.count))] : "x"
            }
            let text = #"{"a":""# + s + #"","b":[""# + s + #"",1]}"#
            let mine = RawJSONWalkTests.canonical(text)
            #expect(mine == Array(text.utf8), "\(text)")
            #expect(try RawJSONWalkTests.jsonC(mine).isSameValue(as: try RawJSONWalkTests.jsonC(text.utf8)), "\(text)")
        }
    }
}
