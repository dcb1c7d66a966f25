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
    /// json-c's compact serialisation of `text` (flagsPlain), the uploader's stored form.
    static func jsonC(_ text: String) throws -> [UInt8] {
        let ref = try Array(text.utf8).withUnsafeBytes { b throws(JSONParseError) in try JSONRef.parse(b, maxDepth: 128) }
        return ref.withSerialized { Array($0) }
    }

    static func jsonCText(_ text: String) -> [UInt8]? {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { t -> [UInt8]? in
            var out = [UInt8](repeating: 0, count: t.count)
            let n = out.withUnsafeMutableBytes { RawJSON.jsonCText(t, 0..<t.count, into: $0.baseAddress) }
            let counted = RawJSON.jsonCText(t, 0..<t.count)
            guard let n else {
                #expect(counted == nil)
                return nil
            }
            #expect(counted == n, "counting and writing agree")
            return Array(out[0..<n])
        }
    }

    @Test func jsonCTextIsJsonCsSerialisationWheneverItAnswers() throws {
        var g = JSONTextGenerator(seed: 13)
        var answered = 0
        var declined = 0
        for _ in 0..<4000 {
            let text = g.value()
            let expected = try Self.jsonC(text)
            if let mine = Self.jsonCText(text) {
                #expect(mine == expected, "\(text)")
                answered += 1
            } else {
                declined += 1
            }
        }
        #expect(answered > 1000 && declined > 200, "both outcomes exercised: \(answered) answered, \(declined) declined")
    }

    @Test func plainTextWithoutRewritesIsAlwaysAnswered() throws {
        var g = JSONTextGenerator(seed: 7)
        g.oddPercent = 0
        for _ in 0..<2000 {
            let text = g.value()
            let mine = try #require(Self.jsonCText(text), "\(text)")
            #expect(mine == (try Self.jsonC(text)))
        }
    }

    @Test func jsonCTextDeclinesWhatJsonCRewrites() {
        for text in [#""a\/b""#, #""\u00e9""#, "-0", "9223372036854775808", #"{"a":1,"a":2}"#, #"[{"x":{"k":1,"k":1}}]"#, #"{"\u0061":1}"#]
        {
            #expect(Self.jsonCText(text) == nil, "\(text)")
        }
        #expect(Self.jsonCText(#"{ "a" : [ 1 , 2.50 ] , "b" : "x\n\"y" }"#) == Array(#"{"a":[1,2.50],"b":"x\n\"y"}"#.utf8))
        #expect(Self.jsonCText(#"{"a":1,"b":{"a":2}}"#) != nil, "the same key in different objects")
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
