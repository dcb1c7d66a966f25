import TestSupport
import Testing

@testable import PylonPluginKit
@testable import pylon_ma

/// The one reader of `ma.eventRecord` params (`EventParams.read`): on random params, what it
/// reads is what json-c reads (json-c is the oracle: a reference model of ma.md's rules on
/// json-c's tree gives the same AppKey, the same verdict and -3 message, or the same event name
/// and a properties text json-c reads as the same value), and the properties it stores are
/// canonical (reading them again gives the same bytes).
struct EventParamsTests {
    /// The reader's outcome as comparable text: the AppKey, then the message or the event's record.
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

    static func outcome(_ text: String) -> String {
        Array(text.utf8).withUnsafeBytes { describe(EventParams.read($0), $0) }
    }

    /// ma.md's rules on json-c's reading of the params (the oracle): nil when valid, else the
    /// message (json-c's member order).
    static func expectedInvalid(_ p: JSON) -> String? {
        guard case .string(let name)? = p["eventName"] else { return EventValidation.nameRequired }
        if let why = Array(name.utf8).withUnsafeBytes({ EventValidation.checkName($0) }) { return why }
        guard let property = p["property"], property != .null else { return nil }
        guard case .object(let o) = property else { return EventValidation.propertyNotObject }
        if o.keys.count > EventValidation.maxProperties { return EventValidation.tooManyProperties(o.keys.count) }
        func value(_ v: JSON) -> String? {
            switch v {
            case .string(let s): return s.utf8.count > EventValidation.maxStringBytes ? EventValidation.stringTooLong : nil
            case .double(let d): return d.isFinite ? nil : EventValidation.notFinite
            case .array(let a): return a.lazy.compactMap(value).first
            case .object(let o):
                for k in o.keys {
                    if k.utf8.count > EventValidation.maxStringBytes { return EventValidation.keyTooLong }
                    if let w = value(o[k]!) { return w }
                }
                return nil
            default: return nil
            }
        }
        for k in o.keys {
            let key = Array(k.utf8)
            if let why = key.withUnsafeBytes({ EventValidation.checkKey($0) }) {
                return key.withUnsafeBytes { EventValidation.badKey($0, why) }
            }
            if let why = value(o[k]!) { return key.withUnsafeBytes { EventValidation.badValue($0, why) } }
        }
        return nil
    }

    @Test func randomParamsReadAsJsonCReadsThem() throws {
        var g = EventGenerator(seed: 2027)
        var recorded = 0
        var invalid = 0
        for _ in 0..<PropertyRuns.count(8000) {
            let text = g.params()
            let bytes = Array(text.utf8)
            // The host refuses a key holding U+0000 (json-c cuts it there): never a plugin's input.
            guard !bytes.withUnsafeBytes({ RawJSON.hasNULKey($0) }) else { continue }
            let j = try JSON.parse(text)
            let want = Self.expectedInvalid(j)
            bytes.withUnsafeBytes { t in
                let got = EventParams.read(t)
                #expect(got.appKey == j["appKey"]?.stringValue, "\(text)")
                #expect((got.invalid == nil) == (want == nil), "\(text): \(got.invalid ?? "valid") / \(want ?? "valid")")
                // With a repeated key, the first failure in member order may be another member's.
                if RawJSON.duplicateKey(in: t) == nil { #expect(got.invalid == want, "\(text)") }
                guard got.invalid == nil else {
                    invalid += 1
                    return
                }
                recorded += 1
                got.withEvent(params: t) { name, properties in
                    #expect(String(decoding: name, as: UTF8.self) == j["eventName"]?.stringValue, "\(text)")
                    let stored = try? JSON.parse(String(decoding: properties, as: UTF8.self))
                    let expected = j["property"].flatMap { $0 == .null ? nil : $0 } ?? .object([:])
                    #expect(stored?.isSameValue(as: expected) == true, "\(text)")
                    #expect(RawJSON.canonicalBytes(properties).elementsEqual(properties), "not canonical: \(text)")
                }
            }
        }
        #expect(
            recorded > PropertyRuns.share(1500, of: 8000) && invalid > PropertyRuns.share(1200, of: 8000),
            "recorded \(recorded), invalid \(invalid)")
    }

    @Test func propertiesAreStoredCanonical() {
        let cases: [(String, String)] = [
            // pylon-bench ma: compact already, stored as written.
            (
                #"{"appKey":"bench","eventName":"purchase","property":{"sku":"SKU-1","price":1999,"currency":"EUR","screen":"checkout"}}"#,
                #""properties":{"sku":"SKU-1","price":1999,"currency":"EUR","screen":"checkout"}"#
            ),
            (#"{"eventName":"tap"}"#, #""properties":{}"#),
            (#"{"eventName":"tap","property":null,"appKey":" bench "}"#, "appKey=[ bench ] record"),
            // Pretty-printed: compact, escapes as written, numbers as written.
            (
                #"{ "appKey": "bench", "eventName": "tap", "property": { "a": [1, -0, 1E2], "b": { "c": "line\nbreak \/ \u00e9" } } }"#,
                #""properties":{"a":[1,-0,1E2],"b":{"c":"line\nbreak \/ \u00e9"}}"#
            ),
            // A repeated key: its last member only (keys compared decoded).
            (#"{"eventName":"tap","property":{"k":1,"j":2,"\u006b":"x"}}"#, #""properties":{"j":2,"\u006b":"x"}"#),
            // Keys and the name decoded.
            (#"{"event\u004eame":"t\u0061p","\u0061ppKey":"\u0062ench"}"#, "appKey=[bench] record"),
            (#"{"eventName":"t\u0061p"}"#, "nameBytes=3"),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text)
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
    }

    @Test func messagesAreTheDocumentedOnes() {
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
            // Keys and names are checked decoded.
            (#"{"eventName":"\u0065l_x"}"#, #"eventName must not start with "el""#),
            (#"{"eventName":"e","property":{"a\nb":1}}"#, "property key \"a\nb\": only lowercase letters"),
            (#"{"eventName":"e","property":{"k\u0065y":"\#(long)"}}"#, #"property "key": string longer than 256 bytes"#),
            // A \u escape counts as the UTF-8 bytes it stands for: 254 + 2 is within the limit.
            (#"{"eventName":"e","property":{"s":"\#(String(repeating: "y", count: 254))\u00e9"}}"#, " record "),
            (#"{"eventName":"e","property":{"s":"\#(String(repeating: "y", count: 255))\u00e9"}}"#, "string longer than 256 bytes"),
            (#"{"eventName":"e","property":{"s":"\#(String(repeating: "y", count: 253))\ud83d\ude00"}}"#, "string longer than 256 bytes"),
            ("null", "eventName is required"),
            ("[1]", "eventName is required"),
            // The entry count is checked before the keys (a repeated key counts once).
            (
                "{\"eventName\":\"e\",\"property\":{" + (0..<500).map { "\"p\($0)\":1" }.joined(separator: ",") + ",\"p0\":2}}",
                " record "
            ),
            (
                "{\"eventName\":\"e\",\"property\":{\"B-\":1," + (0..<500).map { "\"p\($0)\":1" }.joined(separator: ",") + "}}",
                "property has 501 entries; at most 500"
            ),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text)
            #expect(got.contains(expected), "\(text.prefix(80)) -> \(got)")
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
