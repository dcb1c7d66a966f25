import TestSupport
import Testing

@testable import PylonPluginKit
@testable import pylon_uploader

/// The two readers of `uploader.enqueue` params agree: whatever the raw reader (the request's
/// bytes) decides is what the json-c reader decides — the same error (code and message), or the
/// same records (ids, ts, stored bytes) — and it decides ordinary requests itself.
struct EnqueueParamsTests {
    static let wall: Int64 = 1_700_000_000_000

    /// One reader's outcome as comparable text: the stream, consent and records (or error).
    static func describe(_ p: EnqueueParams) -> String {
        var s = "stream=\(p.stream ?? "<nil>") consent=\(p.consent) "
        switch p.records {
        case .failure(let e): s += "error \(e.code) \(e.message)"
        case .success(let r):
            s += "bytes=\(r.bytes)"
            for rec in r.list {
                let id = String(decoding: UnsafeRawBufferPointer(start: rec.id, count: Int(rec.idLength)), as: UTF8.self)
                let body = String(decoding: UnsafeRawBufferPointer(start: rec.body, count: Int(rec.bodyLength)), as: UTF8.self)
                s += " [\(id)|\(rec.ts)|\(body)]"
            }
        }
        return s
    }

    /// Both readers on `text`: (json-c's outcome, the raw reader's or nil when it declined).
    static func outcomes(_ text: String, _ limits: UploaderLimits) throws -> (jsonC: String, raw: String?) {
        let bytes = Array(text.utf8)
        return try bytes.withUnsafeBytes { t throws -> (String, String?) in
            let tree = try JSONRef.parse(t, maxDepth: Plugin.maxDepth)
            let viaJSONC = describe(EnqueueParams(ref: tree.ptr, limits: limits, wall: wall))
            let viaRaw = EnqueueParams.read(raw: t, limits: limits, wall: wall).map(describe)
            return (viaJSONC, viaRaw)
        }
    }

    static var smallLimits: UploaderLimits {
        var l = UploaderLimits()
        l.maxRecordsPerCall = 4
        l.maxRecordBytes = 48
        return l
    }

    @Test func randomParamsGiveTheSameOutcomeThroughBothReaders() throws {
        var g = EnqueueGenerator(seed: 2026)
        var decided = 0
        var declined = 0
        var accepted = 0
        for n in 0..<6000 {
            let text = g.params()
            let limits = n % 3 == 0 ? UploaderLimits() : Self.smallLimits
            let (viaJSONC, viaRaw) = try Self.outcomes(text, limits)
            if let viaRaw {
                #expect(viaRaw == viaJSONC, "\(text)")
                decided += 1
                if !viaRaw.contains(" error ") { accepted += 1 }
            } else {
                declined += 1
            }
        }
        #expect(decided > 2500 && declined > 300 && accepted > 800, "decided \(decided), declined \(declined), accepted \(accepted)")
    }

    /// The uploader reads every request into one `Scratch`: what an earlier request left in it
    /// never shows in a later one's outcome.
    @Test func aReusedScratchReadsLikeAFreshOne() {
        var g = EnqueueGenerator(seed: 13)
        var shared = EnqueueParams.Scratch()
        for n in 0..<3000 {
            let bytes = Array(g.params().utf8)
            let limits = n % 2 == 0 ? UploaderLimits() : Self.smallLimits
            bytes.withUnsafeBytes { t in
                let fresh = EnqueueParams.read(raw: t, limits: limits, wall: Self.wall).map(Self.describe)
                let reused = EnqueueParams.read(raw: t, limits: limits, wall: Self.wall, scratch: &shared).map(Self.describe)
                #expect(reused == fresh, "\(String(decoding: bytes, as: UTF8.self))")
            }
        }
    }

    @Test func ordinaryRequestsAreReadFromTheBytes() throws {
        let cases = [
            #"{"stream":"ma.events","consent":"analytics","records":[{"id":"r1","data":{"eventName":"purchase","property":{"sku":"A-1","price":9.99,"ts":1732900000}}}]}"#,
            #"{"records":[{"id":"a","ts":5,"data":[1,2,"x"]},{"id":"b","data":null},{"id":"c","n":1}],"stream":"s"}"#,
            // Pretty-printed (Python's json.dumps separators): stored compact, as json-c prints it.
            #"{"stream": "s", "records": [{"id": "a", "data": {"k": [1, 2], "u": "é 😀 \n"}}]}"#,
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text, UploaderLimits())
            #expect(viaRaw == viaJSONC, "\(text)")
            #expect(viaRaw != nil && !viaJSONC.contains(" error "), "\(text) -> \(viaJSONC)")
        }
    }

    @Test func escapesAndRewritesAreLeftToJsonC() throws {
        let cases = [
            #"{"stream":"\u0073","records":[{"id":"a","data":1}]}"#,  // stream with an escape
            #"{"st\u0072eam":"s","records":[{"id":"a","data":1}]}"#,  // key with an escape
            #"{"stream":"s","records":[{"id":"a\u0062","data":1}]}"#,  // id with an escape
            #"{"stream":"s","records":[{"id":"a\"b","data":1}]}"#,
            #"{"stream":"s","records":[{"id":"a","data":"x\/y"}]}"#,  // json-c prints x/y
            #"{"stream":"s","records":[{"id":"a","data":{"k":1,"k":2}}]}"#,  // json-c keeps the last
            #"{"stream":"s","records":[{"id":"a","ts":99999999999999999999,"data":1}]}"#,  // json-c clamps
            #"{"stream":"s","consent":"\u0061","records":[{"id":"a","data":1}]}"#,
        ]
        for text in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text, UploaderLimits())
            #expect(viaRaw == nil, "\(text) -> \(viaJSONC)")
        }
    }

    /// Issue 21 item 8: a record the backend refuses (an id with a control character, a
    /// negative ts) made it refuse the whole batch with a 400, which set the batch aside; an
    /// owner enqueueing such records grew the database without bound. Both readers refuse them
    /// at the enqueue.
    @Test func idsAndTimesTheBackendRefusesAreRefusedAtTheEnqueue() throws {
        let l = UploaderLimits()
        let idError = "records[1].id must be a string of 1-128 bytes without control characters"
        let cases: [(String, String)] = [
            (#"{"stream":"s","records":[{"id":"a"},{"id":"x\u0001y"}]}"#, idError),
            (#"{"stream":"s","records":[{"id":"a"},{"id":"x\u0000"}]}"#, idError),
            (#"{"stream":"s","records":[{"id":"a"},{"id":"x\ny"}]}"#, idError),
            (#"{"stream":"s","records":[{"id":"a"},{"id":"x\u007f"}]}"#, idError),
            ("{\"stream\":\"s\",\"records\":[{\"id\":\"a\"},{\"id\":\"x\u{7F}\"}]}", idError),
            (#"{"stream":"s","records":[{"id":"a"},{"id":"b","ts":-1}]}"#, "records[1].ts must be a non-negative integer"),
            (#"{"stream":"s","records":[{"id":"é\u00e9","ts":0}]}"#, "[éé|0|"),
        ]
        for (text, expected) in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text, l)
            #expect(viaJSONC.contains(expected), "\(text) -> \(viaJSONC)")
            if let viaRaw { #expect(viaRaw == viaJSONC, "\(text)") }
        }
        // The raw reader decides a literal DEL itself (valid JSON; no escape to hand to json-c).
        #expect(try Self.outcomes("{\"stream\":\"s\",\"records\":[{\"id\":\"a\"},{\"id\":\"x\u{7F}\"}]}", l).raw != nil)
    }

    @Test func errorsAreWordedAsBefore() throws {
        let l = Self.smallLimits
        let cases: [(String, String)] = [
            (#"{"records":[]}"#, "stream=<nil>"),
            (#"{"stream":"s","records":[]}"#, "params.records must be a non-empty array"),
            (#"{"stream":"s","records":{"id":"a"}}"#, "params.records must be a non-empty array"),
            (#"{"stream":"s","records":[1,2,3,4,5]}"#, "at most 4 records per call"),
            (
                #"{"stream":"s","records":[{"id":"a"},{"id":""}]}"#,
                "records[1].id must be a string of 1-128 bytes without control characters"
            ),
            (#"{"stream":"s","records":[{"id":"a"},7]}"#, "records[1].id must be a string of 1-128 bytes without control characters"),
            (
                #"{"stream":"s","records":[{"id":"a","data":"0123456789012345678901234567890123456789012345678"}]}"#,
                "records[0] is larger than 48 bytes"
            ),
            (#"{"stream":"s","consent":5,"records":[{"id":"a"}]}"#, "consent=invalid"),
            (#"{"stream":"s","records":[{"id":"a"}],"records":{}}"#, "params.records must be a non-empty array"),
            (#"{"stream":"s","records":7,"records":[{"id":"b","data":[ 1 ]}]}"#, "[b|\(Self.wall)|[1]]"),
            (#"{"records":[{"id":"a"},{},[],"x",5,{"\u0069d":1}],"stream":"s"}"#, "at most 4 records per call"),
            (
                #"{"stream":"s","records":[{"id":"a","data":1,"data":{"k":"v"}} , {"id":"b","ts":4.5}]}"#,
                #"[a|\#(Self.wall)|{"k":"v"}] [b|\#(Self.wall)|{"id":"b","ts":4.5}]"#
            ),
        ]
        for (text, expected) in cases {
            let (viaJSONC, viaRaw) = try Self.outcomes(text, l)
            #expect(viaJSONC.contains(expected), "\(text) -> \(viaJSONC)")
            #expect(viaRaw == viaJSONC, "\(text)")
        }
        let longID = String(repeating: "i", count: 129)
        let (viaJSONC, viaRaw) = try Self.outcomes(#"{"stream":"s","records":[{"id":"\#(longID)"}]}"#, l)
        #expect(viaJSONC.contains("records[0].id must be"))
        #expect(viaRaw == viaJSONC)
    }

    @Test func callerInfoFromTextMatchesTheParsedCaller() throws {
        var g = EnqueueGenerator(seed: 5)
        var fast = 0
        for _ in 0..<3000 {
            let text = g.caller()
            let parsed = try JSON.parse(text)
            let viaText = Array(text.utf8).withUnsafeBytes { CallerInfo(text: $0) }
            #expect(viaText == CallerInfo(json: parsed), "\(text)")
            #expect(Principal(caller: viaText) == Principal(caller: parsed))
            if Array(text.utf8).withUnsafeBytes({ CallerInfo.scan($0) }) != nil { fast += 1 }
        }
        #expect(fast > 500, "most callers read from the bytes: \(fast)")
        let host = Array(#"{"client":12,"uid":1000,"gid":1000,"pid":4242,"admin":true}"#.utf8)
        #expect(host.withUnsafeBytes { CallerInfo(text: $0) } == CallerInfo(client: 12, uid: 1000, gid: 1000, pid: 4242, admin: true))
        #expect(CallerInfo(text: nil) == CallerInfo())
    }
}

/// Random enqueue params as text: valid and invalid, with the spellings json-c reads the same but
/// prints differently (whitespace, escapes, repeated keys, `-0`, integers beyond Int64).
struct EnqueueGenerator {
    var text: RandomJSONText
    init(seed: UInt64) {
        text = RandomJSONText(
            seed: seed,
            odds: .init(
                plainSpacePercent: 85, escapePercent: 8,
                plainChars: ["a", "Z", "0", " ", "é", "日本", "😀", #"\n"#, #"\""#, #"\\"#, "\u{7f}", ",", "}", "]"],
                oddNumberPercent: 8, oddNumbers: RandomJSONText.oddNumbers, plainNumbers: RandomJSONText.plainNumbers,
                maxKeys: 4, keyNames: 4, repeatKeyPercent: 5, escapedKeyPercent: 4))
    }

    mutating func id() -> String? {
        switch text.int(40) {
        case 0: return nil
        case 1: return "\"\""
        case 2: return "\"" + String(repeating: "x", count: 128) + "\""
        case 3: return "\"" + String(repeating: "y", count: 129) + "\""
        case 4: return #""a\u0062""#
        case 5: return #""q\"d""#
        case 6: return text.number()
        case 7: return "null"
        case 8: return "\"é😀\""
        case 9: return #""a\u0001b""#
        case 10: return "\"del\u{7F}\""
        default: return "\"r\(text.int(50))\""
        }
    }

    mutating func record() -> String {
        if text.chance(4) { return text.value() }
        var members: [String] = []
        if let id = id() { members.append("\"id\"" + text.space() + ":" + text.space() + id) }
        if text.chance(40) { members.append("\"ts\":" + (text.chance(70) ? text.number() : text.chance(10) ? "-5" : text.value())) }
        if text.chance(85) { members.append("\"data\":" + text.space() + text.value()) }
        if text.chance(10) { members.append("\"extra\":" + text.value()) }
        if text.chance(3) { members.append(#""\u0069d":"z""#) }
        if text.chance(3), let again = members.first { members.append(again) }
        members.shuffle(using: &text.rng)
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }

    mutating func params() -> String {
        var members: [String] = []
        switch text.int(20) {
        case 0: break
        case 1: members.append(#""stream":5"#)
        case 2: members.append(#""stream":"bad name!""#)
        case 3: members.append(#""stream":"\u0073s""#)
        case 4: members.append("\"stream\":\"" + String(repeating: "s", count: 129) + "\"")
        default: members.append("\"stream\":\"" + text.pick(["s", "ma.events", "app:x-1_y"]) + "\"")
        }
        switch text.int(10) {
        case 0: members.append(#""consent":"analytics""#)
        case 1: members.append(#""consent":null"#)
        case 2: members.append(#""consent":"\u0061""#)
        default: break
        }
        switch text.int(20) {
        case 0: break
        case 1: members.append(#""records":{}"#)
        case 2: members.append(#""records":[]"#)
        case 3: members.append("\"records\":" + text.value())
        default:
            let n = text.chance(10) ? 6 : 1 + text.int(3)
            members.append(
                "\"records\":" + text.space() + "[" + (0..<n).map { _ in text.space() + record() + text.space() }.joined(separator: ",")
                    + "]")
        }
        if text.chance(5) { members.append(#""st\u0072eam":"s""#) }
        if text.chance(10) { members.append("\"other\":" + text.value()) }
        members.shuffle(using: &text.rng)
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }

    /// A `_pylon` caller object, mostly as the host writes it.
    mutating func caller() -> String {
        var members: [String] = []
        for key in ["client", "uid", "gid", "pid"] where text.chance(70) {
            members.append(
                "\"\(key)\":" + text.pick(["0", "1000", "-1", "42", "7.0", "2.5", "1e3", "\"9\"", "null", "true", "99999999999999999999"]))
        }
        if text.chance(50) { members.append("\"plugin\":" + text.pick([#""ma""#, #""m\u0061""#, "5", "null", #""""#])) }
        if text.chance(50) { members.append("\"admin\":" + text.pick(["true", "false", "1", "null", #""true""#])) }
        if text.chance(5) { members.append(#""\u0075id":3"#) }
        if text.chance(5) { members.append(#""nested":{"uid":77}"#) }
        members.shuffle(using: &text.rng)
        return "{" + members.map { text.space() + $0 + text.space() }.joined(separator: ",") + "}"
    }
}

extension SplitMix64: RandomNumberGenerator {}
