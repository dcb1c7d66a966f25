import Testing

@testable import PylonCore

/// Random JSON text with the spellings json-c reads the same but prints differently: whitespace,
/// escapes, repeated keys, `-0`, integers beyond Int64, numbers with fractions and exponents.
struct JSONTextGenerator {
    var rng: SplitMix64
    /// How often (out of 100) to pick a spelling json-c rewrites.
    var oddPercent = 15

    init(seed: UInt64) { rng = SplitMix64(seed: seed) }

    mutating func int(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
    mutating func chance(_ percent: Int) -> Bool { int(100) < percent }
    mutating func space() -> String { chance(80) ? "" : [" ", "\n", "\t ", "  ", "\r\n"][int(5)] }

    mutating func string() -> String {
        var s = "\""
        for _ in 0..<int(6) {
            if chance(oddPercent) {
                s += [#"\/"#, #"\u00e9"#, #"\u0041"#, #"\ud83d\ude00"#, #"\u0000"#, #"\u001f"#][int(6)]
            } else {
                s += ["a", "Z", "0", " ", "é", "日本", "😀", #"\n"#, #"\""#, #"\\"#, #"\t"#, "\u{7f}", ":", ",", "}", "]"][int(16)]
            }
        }
        return s + "\""
    }

    mutating func number() -> String {
        if chance(oddPercent) {
            return ["-0", "9223372036854775808", "18446744073709551616", "-9223372036854775809", "123456789012345678901"][int(5)]
        }
        return [
            "0", "7", "-12", "9.99", "1e5", "1E+05", "-0.0", "0.10", "2.50e-3", "9223372036854775807", "-9223372036854775808", "1732900000",
        ][int(12)]
    }

    mutating func value(depth: Int = 0) -> String {
        switch int(depth > 3 ? 4 : 7) {
        case 0: return string()
        case 1: return number()
        case 2: return ["true", "false", "null"][int(3)]
        case 3: return number()
        case 4, 5: return object(depth: depth)
        default:
            let items = (0..<int(4)).map { _ in space() + value(depth: depth + 1) + space() }
            return "[" + space() + items.joined(separator: ",") + "]"
        }
    }

    mutating func object(depth: Int) -> String {
        var keys: [String] = []
        for _ in 0..<int(4) {
            if chance(oddPercent), let k = keys.randomElement(using: &rng) { keys.append(k) } else { keys.append(key(keys.count)) }
        }
        let members = keys.map { k in space() + k + space() + ":" + space() + value(depth: depth + 1) + space() }
        return "{" + space() + members.joined(separator: ",") + "}"
    }

    /// The `n`th key of an object: distinct from the others unless it is spelled with an escape.
    mutating func key(_ n: Int) -> String { chance(oddPercent) ? #""k\u0065y""# : "\"k\(n)\"" }
}

extension SplitMix64: RandomNumberGenerator {}

struct RawJSONWalkTests {
    /// Pylon's canonical form of `text` (`RawJSON.canonical`), checking that measuring and
    /// writing agree.
    static func canonical(_ text: String) -> [UInt8] {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { t -> [UInt8] in
            let start = RawJSON.skipSpace(t, 0)
            let (length, end) = RawJSON.canonical(t, at: start)
            let written = RawJSON.canonicalBytes(t, at: start)
            #expect(written.count == length, "measuring and writing agree: \(text)")
            #expect(RawJSON.skipSpace(t, end) == t.count, "the walk ends after the value: \(text)")
            return written
        }
    }

    /// json-c's reading of `text` (the oracle).
    static func jsonC(_ text: some Collection<UInt8>) throws -> JSON {
        try Array(text).withUnsafeBytes { b throws(JSONParseError) in try JSONRef.parse(b, maxDepth: 200) }.json
    }

    /// On random text with every spelling (whitespace, escapes, repeated keys, `-0`, integers
    /// beyond Int64, fractions and exponents): the canonical form is valid JSON, json-c reads it
    /// as the same value as the text, and it is stable (its own canonical form).
    @Test func canonicalFormReadsAsTheTextAndIsStable() throws {
        var g = JSONTextGenerator(seed: 13)
        var rewritten = 0
        for _ in 0..<4000 {
            let text = g.value()
            let c = Self.canonical(text)
            #expect(c.withUnsafeBytes { RawJSON.validate($0, maxDepth: 200) } == .valid, "\(text)")
            #expect(try Self.jsonC(c).isSameValue(as: try Self.jsonC(text.utf8)), "\(text) -> \(String(decoding: c, as: UTF8.self))")
            #expect(Self.canonical(String(decoding: c, as: UTF8.self)) == c, "stable: \(text)")
            if c.count != text.utf8.count { rewritten += 1 }
        }
        #expect(rewritten > 1000, "whitespace and repeated keys exercised: \(rewritten)")
    }

    /// What json-c prints (`flagsPlain`: the stored form of queue format 4 and of the backend's
    /// rows before the canonical form) is canonical already: the stores need no migration.
    @Test func jsonCPrintedTextIsAlreadyCanonical() throws {
        var g = JSONTextGenerator(seed: 31)
        for _ in 0..<3000 {
            let text = g.value()
            let printed = try Array(text.utf8).withUnsafeBytes { b throws(JSONParseError) in try JSONRef.parse(b, maxDepth: 200) }
                .withSerialized { Array($0) }
            #expect(Self.canonical(String(decoding: printed, as: UTF8.self)) == printed, "\(text)")
        }
    }

    /// Plain compact text without repeated keys is its own canonical form: stored as written.
    @Test func compactTextIsItsOwnCanonicalForm() {
        for text in [
            #"{"a":[1,2.50],"b":"x\n\"y \/ \u00e9"}"#, "-0", "123456789012345678901", #"{"a":1,"b":{"a":2}}"#, #""\ud83d\ude00""#, "[]",
            "{}",
        ] {
            #expect(Self.canonical(text) == Array(text.utf8), "\(text)")
        }
    }

    @Test func canonicalFormRemovesWhitespaceAndKeepsTheLastOfARepeatedKey() {
        let cases: [(String, String)] = [
            (#"{ "a" : [ 1 , 2.50 ] , "b" : "x\n\"y" }"#, #"{"a":[1,2.50],"b":"x\n\"y"}"#),
            (#"{"a":1,"a":2}"#, #"{"a":2}"#),
            (#"{"a":1,"b":2,"\u0061":3}"#, #"{"b":2,"\u0061":3}"#),
            (#"{"a":{"x":[1,2,3]},"b":2,"a":3,"c":4}"#, #"{"b":2,"a":3,"c":4}"#),
            (#"{"k":1,"k":2,"k":3}"#, #"{"k":3}"#),
            (#"[{"x":{"k":1,"k":1}},{"k":0}]"#, #"[{"x":{"k":1}},{"k":0}]"#),
            (#" { "a" : { "a" : 1 , "a" : 2 } , "a" : { "b" : 1 } } "#, #"{"a":{"b":1}}"#),
            (#"{"\/":1,"/":2}"#, #"{"/":2}"#),
            (#"{"a\u0000":1,"a":2}"#, #"{"a\u0000":1,"a":2}"#),  // two keys once decoded
        ]
        for (text, expected) in cases {
            #expect(String(decoding: Self.canonical(text), as: UTF8.self) == expected, "\(text)")
        }
    }

    /// Strings decoded by the scanner are json-c's strings (escapes, surrogate pairs, lone
    /// surrogates, U+0000 kept).
    @Test func decodedStringsAreJsonCsStrings() throws {
        var g = JSONTextGenerator(seed: 21)
        g.oddPercent = 40
        var cases = (0..<3000).map { _ in g.string() }
        cases += [#""\ud800""#, #""\udc00x""#, #""\ud800\u0041""#, #""\uD83D\uDE00""#, #""a\u0000b""#, #""\b\f\r\/""#]
        for text in cases {
            let mine = Array(text.utf8).withUnsafeBytes { RawJSON.stringValue($0, 0..<$0.count) }
            #expect(mine == (try Self.jsonC(text.utf8)).stringValue, "\(text)")
        }
    }

    /// Integers as json-c reads them: beyond Int64, the nearest Int64.
    @Test func integersAreReadAsJsonCReadsThem() throws {
        for text in [
            "0", "-0", "7", "-12", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
            "123456789012345678901234567890", "-123456789012345678901234567890",
        ] {
            let mine = Array(text.utf8).withUnsafeBytes { RawJSON.integer($0, 0..<$0.count) }
            #expect(mine == (try Self.jsonC(text.utf8)).intValue, "\(text)")
        }
        for text in ["1.5", "1e3", "\"1\"", "-", "true"] {
            #expect(Array(text.utf8).withUnsafeBytes { RawJSON.integer($0, 0..<$0.count) } == nil, "\(text)")
        }
    }

    /// `validate` decides every input itself, and never accepts what json-c rejects: random
    /// text, then the same with bytes flipped, cut or inserted (invalid UTF-8, control
    /// characters, broken escapes and structure), and nesting around the limit.
    @Test func validateNeverAcceptsWhatJsonCRejects() throws {
        var g = JSONTextGenerator(seed: 5)
        var rng = SplitMix64(seed: 77)
        var accepted = 0
        var refused = 0
        let noise: [UInt8] = [
            0x00, 0x01, 0x1F, 0x22, 0x5C, 0x7B, 0x7D, 0x5B, 0x5D, 0x2C, 0x3A, 0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xF0, 0xF4, 0xF5, 0xFF,
            0x75, 0x30,
        ]
        for n in 0..<6000 {
            var bytes = Array(g.value().utf8)
            if n % 2 == 1, !bytes.isEmpty {
                for _ in 0..<(1 + Int(rng.next() % 3)) {
                    let at = Int(rng.next() % UInt64(bytes.count))
                    switch rng.next() % 3 {
                    case 0: bytes[at] = noise[Int(rng.next() % UInt64(noise.count))]
                    case 1: bytes.insert(noise[Int(rng.next() % UInt64(noise.count))], at: at)
                    default: bytes.remove(at: at)
                    }
                    if bytes.isEmpty { break }
                }
            }
            let verdict = bytes.withUnsafeBytes { RawJSON.validate($0, maxDepth: 200) }
            let viaJSONC = try? Self.jsonC(bytes)
            if verdict == .valid {
                #expect(viaJSONC != nil, "validate accepted what json-c rejects: \(bytes)")
                accepted += 1
            } else {
                refused += 1
            }
        }
        #expect(accepted > 2000 && refused > 1000, "accepted \(accepted), refused \(refused)")
        // Nesting: at most maxDepth levels as json-c counts them (a scalar inside a container is
        // a level of its own).
        for depth in 60...68 {
            for inner in ["", "0", #""s""#, "{}", #"{"k":true}"#] {
                let text = Array((String(repeating: "[", count: depth) + inner + String(repeating: "]", count: depth)).utf8)
                let mine = text.withUnsafeBytes { RawJSON.validate($0, maxDepth: 64) }
                let viaJSONC = text.withUnsafeBytes { (try? JSONRef.parse($0, maxDepth: 64)) != nil }
                #expect((mine == .valid) == viaJSONC, "depth \(depth) \(inner)")
                #expect(mine == .valid || mine == .tooDeep, "depth \(depth) \(inner)")
            }
        }
        for (text, levels) in [("0", 1), ("[]", 1), ("[0]", 2), ("[[]]", 2), ("[[0]]", 3), (#"{"a":{}}"#, 2), (#"{"a":{"b":0}}"#, 3)] {
            let bytes = Array(text.utf8)
            #expect(bytes.withUnsafeBytes { RawJSON.validate($0, maxDepth: levels) } == .valid, "\(text)")
            #expect(bytes.withUnsafeBytes { RawJSON.validate($0, maxDepth: levels - 1) } == .tooDeep, "\(text)")
        }
        // Deep nesting does not recurse in the canonical walk.
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(Self.canonical(deep).count == 200_000)
    }

    static func members(_ text: String) -> [(key: String, escaped: Bool, value: String)] {
        let b = Array(text.utf8)
        return b.withUnsafeBytes { t in
            RawJSON.Members(t, 0..<t.count).map {
                (String(decoding: b[$0.key], as: UTF8.self), $0.keyEscaped, String(decoding: b[$0.value], as: UTF8.self))
            }
        }
    }

    static func elements(_ text: String) -> [String] {
        let b = Array(text.utf8)
        return b.withUnsafeBytes { t in RawJSON.Elements(t, 0..<t.count).map { String(decoding: b[$0], as: UTF8.self) } }
    }

    @Test func membersListEveryKeyInOrder() {
        let m = Self.members(#"{ "a" : 1 , "b\"c":"x,}" ,"a":{"n":[1,2]}, "\u0061": true }"#)
        #expect(m.map(\.key) == ["a", #"b\"c"#, "a", #"\u0061"#])
        #expect(m.map(\.escaped) == [false, true, false, true])
        #expect(m.map(\.value) == ["1", #""x,}""#, #"{"n":[1,2]}"#, "true"])
        #expect(Self.members("{}").isEmpty)
        #expect(Self.members("[1]").isEmpty, "not an object")
    }

    @Test func elementsListEveryValue() {
        #expect(Self.elements(#"[ 1 , "a,]" ,{"k":[2,3]}, [] ,null ]"#) == ["1", #""a,]""#, #"{"k":[2,3]}"#, "[]", "null"])
        #expect(Self.elements("[]").isEmpty)
        #expect(Self.elements("[ ]").isEmpty)
        #expect(Self.elements(#"{"a":1}"#).isEmpty, "not an array")
    }

    @Test func iteratorsAgreeWithJsonCOnRandomText() throws {
        var g = JSONTextGenerator(seed: 99)
        g.oddPercent = 0
        for _ in 0..<500 {
            let text = "[" + (0..<g.int(5)).map { _ in g.space() + g.value() + g.space() }.joined(separator: ",") + "]"
            let parsed = try JSON.parse(text, maxDepth: 128)
            let items = Self.elements(text)
            #expect(items.count == parsed.arrayValue?.count)
            for (i, item) in items.enumerated() { #expect(try JSON.parse(item, maxDepth: 128) == parsed.arrayValue?[i]) }
        }
    }
}
