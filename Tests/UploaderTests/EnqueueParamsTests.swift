import TestSupport
import Testing

@testable import PylonPluginKit
@testable import pylon_uploader

/// The one reader of `uploader.enqueue` params (`EnqueueParams.read(raw:)`): on random params,
/// the values it reads are the values json-c reads (json-c is the oracle: a reference model
/// of the method's rules on json-c's tree gives the same stream, consent, error, or records —
/// ids, ts, and bodies json-c reads as the same value), and each body it stores is canonical
/// (reading it again gives the same bytes).
struct EnqueueParamsTests {
    static let wall: Int64 = 1_700_000_000_000

    /// The reader's outcome as comparable text: the stream, consent and records (or error).
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

    static func outcome(_ text: String, _ limits: UploaderLimits) -> String {
        Array(text.utf8).withUnsafeBytes { describe(EnqueueParams.read(raw: $0, limits: limits, wall: wall)) }
    }

    static var smallLimits: UploaderLimits {
        var l = UploaderLimits()
        l.maxRecordsPerCall = 4
        l.maxRecordBytes = 48
        return l
    }

    /// The method's rules on json-c's reading of the params (the oracle): stream, consent, and
    /// the error or each record's (id, ts, data value). No record-size rule (it is the
    /// canonical form's, checked by the cases below).
    struct Expected {
        var stream: String?
        var consent: EnqueueParams.Consent
        var records: Result<[(id: String, ts: Int64, data: JSON)], RPCError>
    }

    static func expected(_ p: JSON, _ limits: UploaderLimits) -> Expected {
        let stream = p["stream"]?.stringValue.flatMap { Uploader.validStream($0) ? $0 : nil }
        let consent: EnqueueParams.Consent =
            p.objectValue?.keys.contains("consent") == true ? (p["consent"]?.stringValue.map { .named($0) } ?? .invalid) : .absent
        func records() -> Result<[(id: String, ts: Int64, data: JSON)], RPCError> {
            guard let list = p["records"]?.arrayValue, !list.isEmpty else { return .failure(EnqueueParams.recordsError) }
            guard list.count <= limits.maxRecordsPerCall else { return .failure(EnqueueParams.tooMany(limits)) }
            var out: [(id: String, ts: Int64, data: JSON)] = []
            for (i, r) in list.enumerated() {
                guard let id = r["id"]?.stringValue, Array(id.utf8).withUnsafeBytes({ EnqueueParams.isValidID($0) }) else {
                    return .failure(EnqueueParams.idError(i))
                }
                var ts = wall
                if case .int(let v)? = r["ts"] {
                    guard v >= 0 else { return .failure(EnqueueParams.tsError(i)) }
                    ts = v
                }
                out.append((id, ts, r["data"] ?? r))
            }
            return .success(out)
        }
        return Expected(stream: stream, consent: consent, records: records())
    }

    @Test func randomParamsReadAsJsonCReadsThem() throws {
        var g = EnqueueGenerator(seed: 2026)
        var accepted = 0
        var refused = 0
        for n in 0..<PropertyRuns.count(6000) {
            let text = g.params()
            let bytes = Array(text.utf8)
            // The host refuses a key holding U+0000 (json-c cuts it there): never a plugin's input.
            guard !bytes.withUnsafeBytes({ RawJSON.hasNULKey($0) }) else { continue }
            var limits = n % 3 == 0 ? UploaderLimits() : Self.smallLimits
            limits.maxRecordBytes = 1 << 20
            let want = Self.expected(try JSON.parse(text), limits)
            let got = bytes.withUnsafeBytes { EnqueueParams.read(raw: $0, limits: limits, wall: Self.wall) }
            #expect(got.stream == want.stream, "\(text)")
            #expect(got.consent == want.consent, "\(text)")
            switch (got.records, want.records) {
            case (.failure(let a), .failure(let b)):
                #expect(a.code == b.code && a.message == b.message, "\(text): \(a.message) / \(b.message)")
                refused += 1
            case (.success(let a), .success(let b)):
                #expect(a.list.count == b.count, "\(text)")
                for (r, e) in zip(a.list, b) {
                    let id = String(decoding: UnsafeRawBufferPointer(start: r.id, count: Int(r.idLength)), as: UTF8.self)
                    let body = UnsafeRawBufferPointer(start: r.body, count: Int(r.bodyLength))
                    #expect(id == e.id && r.ts == e.ts, "\(text)")
                    #expect((try? JSON.parse(String(decoding: body, as: UTF8.self)))?.isSameValue(as: e.data) == true, "\(text)")
                    #expect(RawJSON.canonicalBytes(body).elementsEqual(body), "body not canonical: \(text)")
                }
                accepted += 1
            default:
                Issue.record("\(text): \(Self.describe(got)) / \(want.records)")
            }
        }
        #expect(
            accepted > PropertyRuns.share(800, of: 6000) && refused > PropertyRuns.share(800, of: 6000),
            "accepted \(accepted), refused \(refused)")
    }

    /// The uploader reads every request into one `Scratch`: what an earlier request left in it
    /// never shows in a later one's outcome.
    @Test func aReusedScratchReadsLikeAFreshOne() {
        var g = EnqueueGenerator(seed: 13)
        var shared = EnqueueParams.Scratch()
        for n in 0..<PropertyRuns.count(3000) {
            let bytes = Array(g.params().utf8)
            let limits = n % 2 == 0 ? UploaderLimits() : Self.smallLimits
            bytes.withUnsafeBytes { t in
                let fresh = Self.describe(EnqueueParams.read(raw: t, limits: limits, wall: Self.wall))
                let reused = Self.describe(EnqueueParams.read(raw: t, limits: limits, wall: Self.wall, scratch: &shared))
                #expect(reused == fresh, "\(String(decoding: bytes, as: UTF8.self))")
            }
        }
    }

    @Test func bodiesAreStoredCanonical() {
        let cases: [(String, String)] = [
            (
                #"{"stream":"ma.events","consent":"analytics","records":[{"id":"r1","data":{"eventName":"purchase","property":{"sku":"A-1","price":9.99,"ts":1732900000}}}]}"#,
                #"[r1|\#(Self.wall)|{"eventName":"purchase","property":{"sku":"A-1","price":9.99,"ts":1732900000}}]"#
            ),
            (
                #"{"records":[{"id":"a","ts":5,"data":[1,2,"x"]},{"id":"b","data":null},{"id":"c","n":1}],"stream":"s"}"#,
                #"[a|5|[1,2,"x"]] [b|\#(Self.wall)|null] [c|\#(Self.wall)|{"id":"c","n":1}]"#
            ),
            // Pretty-printed (Python's json.dumps separators): stored compact, escapes as written.
            (
                #"{"stream": "s", "records": [{"id": "a", "data": {"k": [1, 2], "u": "é 😀 \n \u00e9 \/"}}]}"#,
                #"[a|\#(Self.wall)|{"k":[1,2],"u":"é 😀 \n \u00e9 \/"}]"#
            ),
            // Numbers as written.
            (
                #"{"stream":"s","records":[{"id":"a","data":[-0,1.50,123456789012345678901,1E2]}]}"#,
                #"|[-0,1.50,123456789012345678901,1E2]]"#
            ),
            // A repeated key: the last member only (keys compared decoded), in every object.
            (#"{"stream":"s","records":[{"id":"a","data":{"k":1,"j":[{"x":1,"x":2}],"\u006b":3}}]}"#, #"|{"j":[{"x":2}],"\u006b":3}]"#),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text, UploaderLimits())
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
    }

    @Test func keysAndStringsAreDecoded() {
        let cases: [(String, String)] = [
            (#"{"stream":"\u0073","records":[{"id":"a","data":1}]}"#, "stream=s "),
            (#"{"st\u0072eam":"s","records":[{"id":"a","data":1}]}"#, "stream=s "),
            (#"{"stream":"s","records":[{"\u0069d":"a\u0062","data":1}]}"#, "[ab|"),
            (#"{"stream":"s","records":[{"id":"a\"b","data":1}]}"#, #"[a"b|"#),
            (#"{"stream":"s","records":[{"id":"\ud83d\ude00","d\u0061ta":1}]}"#, "[😀|\(Self.wall)|1]"),
            (#"{"stream":"s","consent":"\u0061","records":[{"id":"a","data":1}]}"#, #"consent=named("a")"#),
            // An integer ts beyond Int64 reads as the nearest Int64 (as json-c reads it).
            (#"{"stream":"s","records":[{"id":"a","ts":99999999999999999999,"data":1}]}"#, "[a|\(Int64.max)|1]"),
            (#"{"stream":"s","records":[{"id":"a","ts":-99999999999999999999,"data":1}]}"#, "records[0].ts must be a non-negative integer"),
        ]
        for (text, expected) in cases {
            let got = Self.outcome(text, UploaderLimits())
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
    }

    /// Issue 21 item 8: a record the backend refuses (an id with a control character, a
    /// negative ts) made it refuse the whole batch with a 400, which set the batch aside; an
    /// owner enqueueing such records grew the database without bound. The reader refuses them
    /// at the enqueue.
    @Test func idsAndTimesTheBackendRefusesAreRefusedAtTheEnqueue() {
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
            let got = Self.outcome(text, l)
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
    }

    @Test func errorsAreWordedAsBefore() {
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
            // The size is the stored (canonical) form's: whitespace does not count.
            (#"{"stream":"s","records":[{"id":"a","data":[1,        2,        3,        4,        5,        6]}]}"#, "[a|"),
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
            let got = Self.outcome(text, l)
            #expect(got.contains(expected), "\(text) -> \(got)")
        }
        let longID = String(repeating: "i", count: 129)
        #expect(Self.outcome(#"{"stream":"s","records":[{"id":"\#(longID)"}]}"#, l).contains("records[0].id must be"))
    }

    @Test func callerInfoFromTextMatchesTheParsedCaller() throws {
        var g = EnqueueGenerator(seed: 5)
        var fast = 0
        for _ in 0..<PropertyRuns.count(3000) {
            let text = g.caller()
            let parsed = try JSON.parse(text)
            let viaText = Array(text.utf8).withUnsafeBytes { CallerInfo(text: $0) }
            #expect(viaText == CallerInfo(json: parsed), "\(text)")
            #expect(Principal(caller: viaText) == Principal(caller: parsed))
            if Array(text.utf8).withUnsafeBytes({ CallerInfo.scan($0) }) != nil { fast += 1 }
        }
        #expect(fast > PropertyRuns.share(500, of: 3000), "most callers read from the bytes: \(fast)")
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
