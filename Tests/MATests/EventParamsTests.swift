import TestSupport
import Testing

@testable import PylonPluginKit
@testable import pylon_ma

/// The two readers of `ma.eventRecord` params agree: whatever the raw reader (the request's
/// bytes) decides is what the json-c reader decides — the same AppKey, the same -3 message, or
/// the same event text — and it decides ordinary requests itself.
struct EventParamsTests {
    /// One reader's outcome as comparable text: the AppKey, then the message or the event's record.
    static func describe(_ p: EventParams, _ t: UnsafeRawBufferPointer) -> String {
        let head = "appKey=\(p.appKey.map { "[\($0)]" } ?? "<nil>") "
        if let why = p.invalid { return head + "invalid " + why }
        return p.withEvent(params: t) { name, properties in
            var out: [UInt8] = []
            EventText.record(
                idPrefix: Array("dev".utf8), seq: 1, name: name, timeMs: 5, euid: "E", session: "S", properties: properties,
                tail: EventText.tail(utm: [:], device: [("os", "linux")]), into: &out)
            return head + "record " + String(decoding: out, as: UTF8.self) + " nameBytes=\(name.count)"
        }
    }

    /// Both readers on `text`: (json-c's outcome, the raw reader's or nil when it declined).
    static func outcomes(_ text: String) throws -> (jsonC: String, raw: String?) {
        try Array(text.utf8).withUnsafeBytes { t throws -> (String, String?) in
            let tree = try JSONRef.parse(t, maxDepth: Plugin.maxDepth)
            return (describe(EventParams(ref: tree.ptr), t), EventParams.read(raw: t).map { describe($0, t) })
        }
    }

    @Test func randomParamsGiveTheSameOutcomeThroughBothReaders() throws {
        var g = EventGenerator(seed: 2027)
        var decided = 0
        var declined = 0
        var recorded = 0
        var invalid = 0
        for _ in 0..<8000 {
            let text = g.params()
            let (viaJSONC, viaRaw) = try Self.outcomes(text)
            if let viaRaw {
                #expect(viaRaw == viaJSONC, "\(text)")
                decided += 1
                if viaRaw.contains(" record ") { recorded += 1 } else { invalid += 1 }
            } else {
                declined += 1
            }
        }
        #expect(
            decided > 3000 && declined > 500 && recorded > 1500 && invalid > 1200,
            "decided \(decided), declined \(declined), recorded \(recorded), invalid \(invalid)")
    }

    @Test func ordinaryRequestsAreReadFromTheBytes() throws {
        let cases = [
            // pylon-bench ma, the anchors' pylon_ma row, the python client (compact, UTF-8 as is).
            #"{"appKey":"bench","eventName":"purchase","property":{"sku":"SKU-1","price":1999,"currency":"EUR","screen":"checkout"}}"#,
            #"{"appKey":"bench","eventName":"purchase","property":{"sku":"A-1","price":9.99,"session":"3f2a9c1e-7b4d-4e8a-9c21-5d6e7f8a9b0c"}}"#,
            #"{"eventName":"页面","property":{"title":"é 😀","tags":["a","b"],"n":null,"ok":true,"pos":{"x":-1.5e3,"y":0}}}"#,
            #"{"eventName":"tap"}"#,
            #"{"eventName":"tap","property":null,"appKey":" bench "}"#,
            // Pretty-printed: the record holds the properties compact, as json-c prints them.
            #"{ "appKey": "bench", "eventName": "tap", "property": { "a": [1, 2], "b": { "c": "line\nbreak" } } }"#,
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text)
            #expect(viaRaw == viaJSONC, "\(text)")
            #expect(viaRaw != nil && viaJSONC.contains(" record "), "\(text) -> \(viaJSONC)")
        }
        let (pretty, _) = try Self.outcomes(cases[5])
        #expect(pretty.contains(#""properties":{"a":[1,2],"b":{"c":"line\nbreak"}}"#), "\(pretty)")
    }

    @Test func escapesAndRewritesAreLeftToJsonC() throws {
        let cases = [
            #"{"eventName":"\u0065l_x"}"#,  // spells "el_x": json-c decodes it
            #"{"eventName":"a\"b"}"#,
            #"{"event\u004eame":"tap"}"#,  // key with an escape
            #"{"eventName":"tap","appKey":"\u0062ench"}"#,
            #"{"eventName":"tap","property":{"k\u0065y":1}}"#,
            #"{"eventName":"tap","property":{"a\nb":1}}"#,  // the message names the decoded key
            #"{"eventName":"tap","property":{"k":1,"k":"x"}}"#,  // json-c keeps the last
            #"{"eventName":"tap","property":{"k":{"n":{"a\tb":1}}}}"#,
            #"{"eventName":"tap","property":{"k":"x\/y"}}"#,  // json-c prints x/y
            #"{"eventName":"tap","property":{"k":-0}}"#,  // json-c prints 0
            #"{"eventName":"tap","property":{"k":99999999999999999999}}"#,  // json-c clamps
            "null", "[1]",
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text)
            #expect(viaRaw == nil, "\(text) -> \(viaJSONC)")
        }
    }

    @Test func messagesAreTheDocumentedOnes() throws {
        let long = String(repeating: "x", count: 257)
        let cases: [(String, String)] = [
            (#"{"appKey":"a"}"#, "eventName is required and must be a string"),
            (#"{"eventName":5}"#, "eventName is required and must be a string"),
            (#"{"eventName":""}"#, "eventName must not be empty"),
            (#"{"eventName":"el_x"}"#, #"eventName must not start with "el""#),
            (#"{"eventName":"\#(long)"}"#, "eventName is longer than 256 bytes"),
            (#"{"eventName":"e","property":[1]}"#, "property must be an object"),
            (#"{"eventName":"e","property":{"1a":1}}"#, #"property key "1a": must start with a lowercase letter"#),
            // ma.md §3: an uppercase letter anywhere, the first included, is refused (-3).
            (#"{"eventName":"e","property":{"Price":1}}"#, #"property key "Price": must start with a lowercase letter"#),
            (#"{"eventName":"e","property":{"_a":1}}"#, #"property key "_a": must start with a lowercase letter"#),
            (#"{"eventName":"e","property":{"aB":1}}"#, #"property key "aB": only lowercase letters, digits and _ are allowed"#),
            (#"{"eventName":"e","property":{"a\#(long)":1}}"#, #"longer than 256 bytes"#),
            (#"{"eventName":"e","property":{"s":"\#(long)"}}"#, #"property "s": string longer than 256 bytes"#),
            (#"{"eventName":"e","property":{"s":[1,{"k":"\#(long)"}]}}"#, #"property "s": string longer than 256 bytes"#),
            (#"{"eventName":"e","property":{"s":{"\#(long)":1}}}"#, #"property "s": key longer than 256 bytes"#),
            (#"{"eventName":"e","property":{"d":1e999}}"#, #"property "d": numbers must be finite"#),
            (#"{"eventName":"e","property":{"d":[-1E400]}}"#, #"property "d": numbers must be finite"#),
            // Escapes count as the byte they stand for: 250 + 6 is within the limit.
            (#"{"eventName":"e","property":{"s":"\#(String(repeating: "y", count: 250))\n\n\n\"\"\\"}}"#, " record "),
            (#"{"eventName":"e","property":{"s":"\#(String(repeating: "y", count: 251))\n\n\n\"\"\\"}}"#, "string longer than 256 bytes"),
            // The entry count is checked before the keys.
            (
                "{\"eventName\":\"e\",\"property\":{\"B-\":1," + (0..<500).map { "\"p\($0)\":1" }.joined(separator: ",") + "}}",
                "property has 501 entries; at most 500"
            ),
        ]
        for (text, expected) in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text)
            #expect(viaJSONC.contains(expected), "\(text.prefix(80)) -> \(viaJSONC)")
            #expect(viaRaw == viaJSONC, "\(text.prefix(80))")
        }
    }
}

/// Random `ma.eventRecord` params as text: valid and invalid under every rule, with the
/// spellings json-c reads the same but prints differently (whitespace, escapes, repeated keys,
/// `-0`, integers beyond Int64) and numbers it reads as infinite.
struct EventGenerator {
    var text: RandomJSONText
    init(seed: UInt64) {
        var odds = RandomJSONText.Odds(
            plainSpacePercent: 85, escapePercent: 6,
            plainChars: ["a", "z", "Z", "0", "_", "-", " ", "é", "日本", "😀", #"\n"#, #"\""#, #"\\"#, #"\t"#, "\u{7f}", ",", "}"],
            oddNumberPercent: 10, oddNumbers: RandomJSONText.oddNumbers + ["1e999", "-1E400", "2.5e-400"],
            plainNumbers: RandomJSONText.plainNumbers + ["1999"],
            maxKeys: 4, keyNames: 4, repeatKeyPercent: 5, escapedKeyPercent: 5)
        // Strings and keys around MA's 256-byte limit (escapes count as one byte).
        odds.lengthLimit = 256
        odds.longKeyPercent = 5
        text = RandomJSONText(seed: seed, odds: odds)
    }

    /// A top-level property key, valid most of the time.
    mutating func key() -> String {
        switch text.int(30) {
        case 0: return "\"1abc\""
        case 1: return "\"aBc\""
        case 2: return "\"a-b\""
        case 3: return "\"\""
        case 4: return "\"" + String(repeating: "k", count: 255 + text.int(3)) + "\""
        case 5: return #""a\nb""#
        case 6: return #""\u0061""#
        case 7: return "\"é\""
        case 8: return "\"Abc\""
        default: return "\"" + text.pick(["sku", "price", "price_1", "screen", "currency", "n", "tags", "pos"]) + "\""
        }
    }

    mutating func properties() -> String {
        if text.chance(3) {
            // Around the 500-entry limit, sometimes with a repeated key (json-c counts it once).
            var members = (0..<(499 + text.int(3))).map { "\"p\($0)\":\($0)" }
            if text.chance(50) { members.append("\"p0\":1") }
            if text.chance(30) { members[text.int(members.count)] = "\"B-\":1" }
            return "{" + members.joined(separator: ",") + "}"
        }
        var members: [String] = []
        for _ in 0..<text.int(7) {
            members.append(text.chance(5) && !members.isEmpty ? members[0] : key() + text.space() + ":" + text.space() + text.value())
        }
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }

    mutating func eventName() -> String? {
        switch text.int(24) {
        case 0: return nil
        case 1: return "\"\""
        case 2: return "\"el_custom\""
        case 3: return "\"El\""
        case 4: return "\"e\""
        case 5: return "\"" + String(repeating: "n", count: 255 + text.int(3)) + "\""
        case 6: return text.pick(["5", "null", "{}", "[\"x\"]", "true"])
        case 7: return #""a\"b""#
        case 8: return #""\u0065l""#
        case 9: return "\"" + text.stringBody() + "\""
        case 10: return "\"页面\""
        default: return "\"" + text.pick(["purchase", "tap", "view_item", "login"]) + "\""
        }
    }

    mutating func params() -> String {
        if text.chance(1) { return text.pick(["null", "[1]", "\"x\"", "{}"]) }
        var members: [String] = []
        switch text.int(12) {
        case 0: break
        case 1: members.append(#""appKey":5"#)
        case 2: members.append(#""appKey":"\u0062ench""#)
        case 3: members.append(#""appKey":" bench ""#)
        case 4: members.append(#""appKey":"""#)
        default: members.append(#""appKey":"bench""#)
        }
        if let n = eventName() { members.append("\"eventName\"" + text.space() + ":" + text.space() + n) }
        switch text.int(12) {
        case 0: break
        case 1: members.append(#""property":null"#)
        case 2: members.append("\"property\":" + text.pick(["\"x\"", "[1]", "5", "true"]))
        default: members.append("\"property\":" + text.space() + properties())
        }
        if text.chance(4), let again = members.first { members.append(again) }
        if text.chance(3) { members.append(#""event\u004eame":"tap""#) }
        if text.chance(10) { members.append("\"other\":" + text.value()) }
        text.shuffle(&members)
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }
}
