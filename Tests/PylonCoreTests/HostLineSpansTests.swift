import Testing

@testable import PylonCore

/// `RawJSON.hostMessageSpans`, the plugin kit's reader of host-validated lines: on every line
/// the validating scanner accepts it must find the same spans; on anything else it may answer
/// anything but must stay inside the line.
@Suite struct HostLineSpansTests {
    /// Runs `hostMessageSpans` on a copy of `bytes` in an allocation of exactly their size (so an
    /// address-sanitized run, `make test-asan`, catches any read past the end), and checks that
    /// every span it returns lies inside the line and is not empty.
    static func hostSpans(_ bytes: [UInt8]) -> MessageSpans? {
        let buf = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 1)
        defer { buf.deallocate() }
        bytes.withUnsafeBytes { if let b = $0.baseAddress, !$0.isEmpty { buf.baseAddress!.copyMemory(from: b, byteCount: $0.count) } }
        let m = RawJSON.hostMessageSpans(UnsafeRawBufferPointer(buf))
        if let m {
            for r in [m.jsonrpc, m.id, m.method, m.params, m.result, m.error, m.pylon, m.onBehalfOf] {
                guard let r else { continue }
                #expect(r.lowerBound >= 0 && r.upperBound <= bytes.count && !r.isEmpty, "span \(r) of a \(bytes.count)-byte line")
            }
        }
        return m
    }

    static func validated(_ bytes: [UInt8]) -> MessageSpans? {
        bytes.withUnsafeBytes { RawJSON.spans($0, maxDepth: 1_000) }
    }

    @Test(arguments: ScanMessageTests.good)
    func findsTheValidatingScannersSpans(_ s: String) throws {
        let b = Array(s.utf8)
        let want = try #require(Self.validated(b))
        #expect(Self.hostSpans(b) == want)
    }

    @Test func decodesEscapedTopLevelKeysAsTheValidatingScannerDoes() throws {
        for s in [#"{"jsonrpc":"2.0","\u0069d":1,"method":"m"}"#, #"{"id":1,"a\"b":2}"#, #"{"p\u0061rams":[1],"\u005fpylon":{}}"#] {
            let m = try #require(Self.hostSpans(Array(s.utf8)), "\(s)")
            #expect(m == Self.validated(Array(s.utf8)), "\(s)")
            #expect(m.id != nil || m.params != nil, "\(s)")
        }
        // Escapes inside values are fine: their text is the span.
        let s = #"{"id":1,"method":"m","params":{"k\"ey":"v\\\"al\u00e9"}}"#
        #expect(Self.hostSpans(Array(s.utf8)) == Self.validated(Array(s.utf8)))
    }

    @Test func refusesWhatIsNotShapedLikeAnObject() {
        for s in ["", "  ", "[1]", "42", #""x""#, "{", #"{"a":1"#, #"{"a" 1}"#, #"{"a":}"#, #"{"a":1} x"#, #"{"a":1,}"#, #"{"a":,"b":1}"#] {
            #expect(Self.hostSpans(Array(s.utf8)) == nil, "\(s)")
        }
    }

    /// Depth is the host's business: a line nested beyond the kit's json-c limit is still read.
    @Test func depthDoesNotMatter() throws {
        let deep = #"{"id":3,"method":"m","params":"# + String(repeating: "[", count: 500) + String(repeating: "]", count: 500) + "}"
        let m = try #require(Self.hostSpans(Array(deep.utf8)))
        #expect(m.params.map { $0.count } == 1_000)
        #expect(m.id == Self.validated(Array(deep.utf8))?.id)
    }

    /// Generated messages: members in random order and spacing, values of every kind nested a
    /// few levels, repeated keys, strings with escapes and non-ASCII text. Wherever the
    /// validating scanner accepts, the spans are the same.
    @Test func agreesWithTheValidatingScannerOnGeneratedMessages() {
        var g = Generator(seed: 0x4057)
        var compared = 0
        for _ in 0..<20_000 {
            let b = Array(g.message().utf8)
            guard let want = Self.validated(b) else { continue }
            compared += 1
            let got = Self.hostSpans(b)
            #expect(got == want, "\(String(decoding: b, as: UTF8.self))")
        }
        // (Lines repeating a routing member are refused by the validating scanner: not compared.)
        #expect(compared > 12_000, "the generator must produce valid lines")
    }

    /// Mutated messages and random bytes: whatever comes back stays inside the line
    /// (`hostSpans` checks), and where the mutated line is still valid the spans agree.
    @Test func staysInsideArbitraryBytes() {
        var g = Generator(seed: 0xBAD)
        let alphabet = Array(#"{}[]":,.-0123456789eE \tnulltruefalse\u"#.utf8) + [0x00, 0x0A, 0xC3, 0xFF]
        var stillValid = 0
        for round in 0..<30_000 {
            var b: [UInt8]
            if round % 5 == 0 {
                b = (0..<Int(g.rng.next() % 48)).map { _ in alphabet[Int(g.rng.next() % UInt64(alphabet.count))] }
            } else {
                b = Array(g.message().utf8)
                for _ in 0...(g.rng.next() % 3) {
                    guard !b.isEmpty else { break }
                    let at = Int(g.rng.next() % UInt64(b.count))
                    switch g.rng.next() % 4 {
                    case 0: b[at] = alphabet[Int(g.rng.next() % UInt64(alphabet.count))]
                    case 1: b.remove(at: at)
                    case 2: b.insert(b[at], at: at)
                    default: b.removeLast(b.count - at)
                    }
                }
            }
            let got = Self.hostSpans(b)
            if let want = Self.validated(b) {
                stillValid += 1
                #expect(got == want, "\(String(decoding: b, as: UTF8.self))")
            }
        }
        #expect(stillValid > 1_000)
    }

    /// Random JSON-RPC message text.
    struct Generator {
        var rng: SplitMix64
        init(seed: UInt64) { rng = SplitMix64(seed: seed) }

        mutating func pick<T>(_ xs: [T]) -> T { xs[Int(rng.next() % UInt64(xs.count))] }
        mutating func ws() -> String { rng.next() % 4 == 0 ? pick([" ", "  ", "\t", "\n ", "\r\n"]) : "" }

        mutating func string() -> String {
            let pieces = [
                "a", "id", "method", "é", "中", "😀", #"\""#, #"\\"#, #"\/"#, #"\n"#, #"\u00e9"#, #"\ud83d\ude00"#, " ", "{", "]", ",", ":",
            ]
            return "\"" + (0..<Int(rng.next() % 6)).map { _ in pick(pieces) }.joined() + "\""
        }

        mutating func value(_ depth: Int) -> String {
            switch rng.next() % (depth > 3 ? 6 : 8) {
            case 0: return string()
            case 1: return pick(["0", "-1", "42", "3.25", "-0.5e+3", "1E9", "9223372036854775807", "123456789012345678901"])
            case 2: return pick(["true", "false", "null"])
            case 3, 4: return string()
            case 5: return pick(["{}", "[]"])
            case 6:
                let n = Int(rng.next() % 4)
                return "[" + (0..<n).map { _ in ws() + value(depth + 1) + ws() }.joined(separator: ",") + "]"
            default:
                let n = Int(rng.next() % 4)
                return "{" + (0..<n).map { _ in ws() + string() + ws() + ":" + ws() + value(depth + 1) + ws() }.joined(separator: ",") + "}"
            }
        }

        mutating func message() -> String {
            var members: [String] = []
            let keys = ["jsonrpc", "id", "method", "params", "result", "error", "_pylon", "_onBehalfOf", "other", "i", "ids", "paramsX"]
            for _ in 0..<(1 + Int(rng.next() % 7)) {
                let k = pick(keys)
                let v: String
                switch k {
                case "id", "_onBehalfOf": v = pick(["1", "42", "-7", #""abc""#, "null", "1.5"])
                case "method": v = pick([#""ma.eventRecord""#, #""uploader.enqueue""#, #""a\u002eb""#])
                case "_pylon": v = pick([#"{"client":3,"uid":1000,"gid":1000,"pid":77}"#, #"{"plugin":"ma"}"#])
                default: v = value(0)
                }
                members.append(ws() + "\"" + k + "\"" + ws() + ":" + ws() + v + ws())
            }
            if rng.next() % 50 == 0 { members = [] }
            return ws() + "{" + members.joined(separator: ",") + (members.isEmpty ? ws() : "") + "}" + ws()
        }
    }
}
