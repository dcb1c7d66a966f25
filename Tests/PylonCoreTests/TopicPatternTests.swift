import Testing

@testable import PylonCore

struct TopicPatternTests {
    @Test(arguments: [
        ("push.*", "push.message", true),
        ("push.*", "push.", true),
        ("push.*", "pushx.message", false),
        ("*", "anything.at.all", true),
        ("*.changed", "consent.changed", true),
        ("*.changed", "consent.changedx", false),
        ("a.*.c", "a.b.c", true),
        ("a.*.c", "a.b.d", false),
        ("exact", "exact", true),
        ("exact", "exactly", false),
        ("a*b*c", "aXbYc", true),
        ("a*b*c", "acb", false),
        ("ab*ba", "aba", false),
        ("ab*ba", "abba", true),
        ("**", "", true),
        ("", "", true),
        ("", "x", false),
        ("a*", "", false),
        ("*a*a*", "aa", true),
        ("*a*a*", "a", false),
    ])
    func matches(pattern: String, topic: String, expected: Bool) {
        #expect(TopicPattern(pattern).matches(topic) == expected)
    }

    /// Against a plain recursive glob, on random patterns and topics over a small alphabet.
    @Test func agreesWithARecursiveGlob() {
        func glob(_ p: ArraySlice<UInt8>, _ t: ArraySlice<UInt8>) -> Bool {
            guard let c = p.first else { return t.isEmpty }
            if c == UInt8(ascii: "*") { return (t.startIndex...t.endIndex).contains { glob(p.dropFirst(), t[$0...]) } }
            return t.first == c && glob(p.dropFirst(), t.dropFirst())
        }
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("ab.*".utf8)
        for _ in 0..<3000 {
            let p = (0..<Int.random(in: 0...7, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }
            let t = (0..<Int.random(in: 0...9, using: &rng)).map { _ in alphabet.dropLast().randomElement(using: &rng)! }
            let ps = String(decoding: p, as: UTF8.self), ts = String(decoding: t, as: UTF8.self)
            #expect(TopicPattern(ps).matches(ts) == glob(p[...], t[...]), "\(ps) vs \(ts)")
        }
    }

    /// The input that held the host's loop for 34 s with the search by characters.
    @Test func longPiecesAreMatchedExactly() {
        let a20k = String(repeating: "a", count: 20_000)
        let topic = "x." + String(repeating: "a", count: 40_000)
        #expect(!TopicPattern("*" + a20k + "b*").matches(topic))
        #expect(TopicPattern("*" + a20k + "*").matches(topic))
        #expect(TopicPattern("x.*" + a20k).matches(topic))
    }
}
